//! The `--plot FILE` latency chart: RTT against percentile, one thin line per
//! round and a thick line for all rounds pooled, in the style of HdrHistogram's
//! percentile-distribution plots (the x axis stretches the tail: 90 %, 99 %,
//! 99.9 % … are equally spaced; the y axis is logarithmic).
//!
//! Written as SVG (text as `<text>`, nothing to install) or PNG (drawn here on
//! an RGB raster with the public-domain 8×8 bitmap font of `font8x8`, encoded
//! with the `png` crate), chosen by the file's extension.

use std::path::Path;

use hdrhistogram::Histogram;

type Rgb = [u8; 3];

const W: usize = 960;
const H: usize = 600;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 48.0;
const TOP: f64 = 72.0;
const BOTTOM: f64 = 64.0;

const BLACK: Rgb = [0, 0, 0];
const GRID: Rgb = [220, 220, 220];
const GRID_MINOR: Rgb = [240, 240, 240];
const WHITE: Rgb = [255, 255, 255];
const PALETTE: [Rgb; 10] = [
    [31, 119, 180],
    [255, 127, 14],
    [44, 160, 44],
    [214, 39, 40],
    [148, 103, 189],
    [140, 86, 75],
    [227, 119, 194],
    [127, 127, 127],
    [188, 189, 34],
    [23, 190, 207],
];

#[derive(Clone, Copy)]
enum Anchor {
    Start,
    Middle,
    End,
}

/// The few drawing operations the chart needs, in pixel coordinates.
trait Canvas {
    fn rect(&mut self, x: f64, y: f64, w: f64, h: f64, fill: Rgb);
    fn polyline(&mut self, pts: &[(f64, f64)], color: Rgb, width: f64);
    /// `y` is the text's vertical centre; `big` is the title size.
    fn text(&mut self, x: f64, y: f64, s: &str, anchor: Anchor, big: bool, color: Rgb);
}

struct Svg {
    out: String,
}

fn hex(c: Rgb) -> String {
    format!("#{:02x}{:02x}{:02x}", c[0], c[1], c[2])
}

fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

impl Canvas for Svg {
    fn rect(&mut self, x: f64, y: f64, w: f64, h: f64, fill: Rgb) {
        self.out.push_str(&format!(
            "<rect x=\"{x:.1}\" y=\"{y:.1}\" width=\"{w:.1}\" height=\"{h:.1}\" fill=\"{}\"/>\n",
            hex(fill)
        ));
    }
    fn polyline(&mut self, pts: &[(f64, f64)], color: Rgb, width: f64) {
        let p: Vec<String> = pts.iter().map(|(x, y)| format!("{x:.1},{y:.1}")).collect();
        self.out.push_str(&format!(
            "<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"{width}\" points=\"{}\"/>\n",
            hex(color),
            p.join(" ")
        ));
    }
    fn text(&mut self, x: f64, y: f64, s: &str, anchor: Anchor, big: bool, color: Rgb) {
        let a = match anchor {
            Anchor::Start => "start",
            Anchor::Middle => "middle",
            Anchor::End => "end",
        };
        self.out.push_str(&format!(
            "<text x=\"{x:.1}\" y=\"{y:.1}\" dominant-baseline=\"middle\" text-anchor=\"{a}\" font-family=\"sans-serif\" font-size=\"{}\" fill=\"{}\">{}</text>\n",
            if big { 18 } else { 12 },
            hex(color),
            xml_escape(s)
        ));
    }
}

struct Raster {
    px: Vec<u8>,
}

impl Raster {
    fn put(&mut self, x: i64, y: i64, c: Rgb) {
        if (0..W as i64).contains(&x) && (0..H as i64).contains(&y) {
            let i = (y as usize * W + x as usize) * 3;
            self.px[i..i + 3].copy_from_slice(&c);
        }
    }
}

impl Canvas for Raster {
    fn rect(&mut self, x: f64, y: f64, w: f64, h: f64, fill: Rgb) {
        for yy in y.round() as i64..(y + h).round() as i64 {
            for xx in x.round() as i64..(x + w).round() as i64 {
                self.put(xx, yy, fill);
            }
        }
    }
    fn polyline(&mut self, pts: &[(f64, f64)], color: Rgb, width: f64) {
        let r = ((width - 1.0) / 2.0).max(0.0);
        for seg in pts.windows(2) {
            let ((x0, y0), (x1, y1)) = (seg[0], seg[1]);
            let steps = ((x1 - x0).abs().max((y1 - y0).abs()) * 2.0).ceil().clamp(1.0, 10_000.0) as usize;
            for k in 0..=steps {
                let t = k as f64 / steps as f64;
                let (x, y) = (x0 + (x1 - x0) * t, y0 + (y1 - y0) * t);
                for yy in (y - r).round() as i64..=(y + r).round() as i64 {
                    for xx in (x - r).round() as i64..=(x + r).round() as i64 {
                        self.put(xx, yy, color);
                    }
                }
            }
        }
    }
    fn text(&mut self, x: f64, y: f64, s: &str, anchor: Anchor, big: bool, color: Rgb) {
        use font8x8::UnicodeFonts;
        let scale: i64 = if big { 2 } else { 1 };
        let adv = 8 * scale;
        let width = s.chars().count() as i64 * adv;
        let x0 = match anchor {
            Anchor::Start => x.round() as i64,
            Anchor::Middle => x.round() as i64 - width / 2,
            Anchor::End => x.round() as i64 - width,
        };
        let y0 = y.round() as i64 - 4 * scale;
        for (n, ch) in s.chars().enumerate() {
            let glyph = font8x8::BASIC_FONTS.get(ch).or_else(|| font8x8::LATIN_FONTS.get(ch)).unwrap_or([0; 8]);
            for (row, bits) in glyph.iter().enumerate() {
                for col in 0..8 {
                    // Bit 0 is the leftmost pixel of the row.
                    if bits & (1 << col) != 0 {
                        for dy in 0..scale {
                            for dx in 0..scale {
                                self.put(x0 + n as i64 * adv + col * scale + dx, y0 + row as i64 * scale + dy, color);
                            }
                        }
                    }
                }
            }
        }
    }
}

/// One line of the chart.
pub struct Series<'a> {
    pub label: String,
    pub hist: &'a Histogram<u64>,
}

fn pct_label(nines: i32) -> String {
    match nines {
        0 => "0%".into(),
        1 => "90%".into(),
        2 => "99%".into(),
        n => format!("99.{}%", "9".repeat((n - 2) as usize)),
    }
}

fn us_label(v: f64) -> String {
    if v >= 1e6 {
        format!("{}s", v / 1e6)
    } else if v >= 1e3 {
        format!("{}ms", v / 1e3)
    } else {
        format!("{v}")
    }
}

fn draw(c: &mut dyn Canvas, title: &str, subtitle: &str, pooled: &Series<'_>, rounds: &[Series<'_>]) {
    c.rect(0.0, 0.0, W as f64, H as f64, WHITE);
    let (pw, ph) = (W as f64 - LEFT - RIGHT, H as f64 - TOP - BOTTOM);
    let n = pooled.hist.len().max(1);
    // Percentiles beyond 1 - 1/n say nothing more: stop at the last power of
    // ten below n (at least 99 %, at most 99.9999 %).
    let xmax = ((n as f64).log10().floor() as i32).clamp(2, 6);
    let (lo_ns, hi_ns) =
        if pooled.hist.is_empty() { (1_000, 1_000_000) } else { (pooled.hist.min().max(1), pooled.hist.max().max(2)) };
    let ymin = (lo_ns as f64 / 1e3).log10().floor() as i32;
    let ymax = ((hi_ns as f64 / 1e3).log10().ceil() as i32).max(ymin + 1);
    let sx = |x: f64| LEFT + x / xmax as f64 * pw;
    let sy = |v_us: f64| {
        let l = v_us.max(10f64.powi(ymin)).log10();
        TOP + ph - (l - ymin as f64) / (ymax - ymin) as f64 * ph
    };
    // Grid: minor lines at 2x and 5x, major at powers of ten.
    for e in ymin..ymax {
        for m in [2.0, 5.0] {
            let y = sy(m * 10f64.powi(e));
            c.polyline(&[(LEFT, y), (LEFT + pw, y)], GRID_MINOR, 1.0);
        }
    }
    for e in ymin..=ymax {
        let v = 10f64.powi(e);
        let y = sy(v);
        c.polyline(&[(LEFT, y), (LEFT + pw, y)], GRID, 1.0);
        c.text(LEFT - 8.0, y, &us_label(v), Anchor::End, false, BLACK);
    }
    for k in 0..=xmax {
        let x = sx(k as f64);
        c.polyline(&[(x, TOP), (x, TOP + ph)], GRID, 1.0);
        c.text(x, TOP + ph + 14.0, &pct_label(k), Anchor::Middle, false, BLACK);
    }
    c.polyline(&[(LEFT, TOP), (LEFT, TOP + ph), (LEFT + pw, TOP + ph)], BLACK, 1.0);
    c.text(W as f64 / 2.0, 18.0, title, Anchor::Middle, true, BLACK);
    c.text(W as f64 / 2.0, 40.0, subtitle, Anchor::Middle, false, BLACK);
    c.text(LEFT, TOP - 12.0, "RTT (us, log scale)", Anchor::Start, false, BLACK);
    c.text(LEFT + pw / 2.0, H as f64 - 22.0, "percentile", Anchor::Middle, false, BLACK);

    let line = |h: &Histogram<u64>| -> Vec<(f64, f64)> {
        const STEPS: usize = 400;
        (0..=STEPS)
            .map(|k| {
                let x = xmax as f64 * k as f64 / STEPS as f64;
                let q = (1.0 - 10f64.powf(-x)).min(1.0);
                (sx(x), sy(h.value_at_quantile(q) as f64 / 1e3))
            })
            .collect()
    };
    let mut legend: Vec<(String, Rgb, f64)> = Vec::new();
    // Per-round lines only when they stay readable.
    if rounds.len() > 1 && rounds.len() <= 30 {
        for (i, s) in rounds.iter().enumerate().filter(|(_, s)| !s.hist.is_empty()) {
            let color = PALETTE[i % PALETTE.len()];
            c.polyline(&line(s.hist), color, 1.0);
            if legend.len() < 10 {
                legend.push((s.label.clone(), color, 1.0));
            }
        }
    }
    if !pooled.hist.is_empty() {
        c.polyline(&line(pooled.hist), BLACK, 3.0);
    }
    legend.insert(0, (pooled.label.clone(), BLACK, 3.0));
    for (i, (label, color, width)) in legend.iter().enumerate() {
        let y = TOP + 16.0 + i as f64 * 16.0;
        c.polyline(&[(LEFT + 12.0, y), (LEFT + 36.0, y)], *color, *width);
        c.text(LEFT + 44.0, y, label, Anchor::Start, false, BLACK);
    }
}

/// Checks that `path` names a format [`write`] knows, before any work is done.
pub fn check_path(path: &Path) -> anyhow::Result<()> {
    match path.extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase).as_deref() {
        Some("svg") | Some("png") => Ok(()),
        _ => anyhow::bail!("--plot {}: the file name must end in .svg or .png", path.display()),
    }
}

/// Writes the chart to `path`: SVG for `.svg`, PNG for `.png`.
pub fn write(
    path: &Path,
    title: &str,
    subtitle: &str,
    pooled: &Series<'_>,
    rounds: &[Series<'_>],
) -> anyhow::Result<()> {
    let ext = path.extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase);
    match ext.as_deref() {
        Some("svg") => {
            let mut svg = Svg {
                out: format!(
                    "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{H}\" viewBox=\"0 0 {W} {H}\">\n"
                ),
            };
            draw(&mut svg, title, subtitle, pooled, rounds);
            svg.out.push_str("</svg>\n");
            std::fs::write(path, svg.out)?;
        }
        Some("png") => {
            let mut r = Raster { px: vec![255; W * H * 3] };
            draw(&mut r, title, subtitle, pooled, rounds);
            let f = std::io::BufWriter::new(std::fs::File::create(path)?);
            let mut enc = png::Encoder::new(f, W as u32, H as u32);
            enc.set_color(png::ColorType::Rgb);
            enc.set_depth(png::BitDepth::Eight);
            let mut w = enc.write_header()?;
            w.write_image_data(&r.px)?;
            w.finish()?;
        }
        _ => anyhow::bail!("--plot {}: the file name must end in .svg or .png", path.display()),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels() {
        assert_eq!(pct_label(0), "0%");
        assert_eq!(pct_label(1), "90%");
        assert_eq!(pct_label(2), "99%");
        assert_eq!(pct_label(3), "99.9%");
        assert_eq!(pct_label(5), "99.999%");
        assert_eq!(us_label(10.0), "10");
        assert_eq!(us_label(1000.0), "1ms");
        assert_eq!(us_label(0.1), "0.1");
    }

    #[test]
    fn raster_text_marks_pixels() {
        let mut r = Raster { px: vec![255; W * H * 3] };
        r.text(10.0, 10.0, "8", Anchor::Start, false, BLACK);
        assert!(r.px.contains(&0));
    }
}
