//! Turning rounds into rows: the table, the median row, the summary line and
//! the JSON document. Column meanings are documented in the parent module.

use hdrhistogram::Histogram;
use serde::Serialize;

use super::engine::RoundOutcome;

/// How a tool names what it counts.
#[derive(Debug, Clone, Copy)]
pub struct Units {
    /// `rpctest` / `echotest`.
    pub tool: &'static str,
    /// Table header of the rate column: `RPC/s`, `msgs/s`.
    pub rate_col: &'static str,
    /// Summary key of the rate: `rpc_per_s`, `msg_per_s`.
    pub rate_key: &'static str,
}

/// One latency percentile of a row.
#[derive(Debug, Clone, Serialize)]
pub struct Quantile {
    pub percent: f64,
    pub us: f64,
}

/// Per-connection figures of one round (JSON only).
#[derive(Debug, Clone, Serialize)]
pub struct ConnRow {
    pub calls: u64,
    pub secs: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// One row of the table: a round, or the median over rounds.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// Round number from 1; 0 for the median row.
    pub round: usize,
    pub unix_time: u64,
    pub threads: usize,
    pub inflight: usize,
    /// Requests answered, all connections.
    pub calls: u64,
    /// From the common start to the last reply of the slowest connection.
    pub secs: f64,
    /// `calls / secs`.
    pub rate: f64,
    pub min_us: f64,
    pub mean_us: f64,
    pub max_us: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    /// The `-q` percentiles.
    pub quantiles: Vec<Quantile>,
    /// Bytes on the wire both ways (headers and record marks included), in
    /// megabits per second of `secs`.
    pub mbps: f64,
    pub tx_bytes: u64,
    pub rx_bytes: u64,
    pub reads: u64,
    pub writes: u64,
    /// Connections that failed, plus one if the round hit its time limit.
    pub errors: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Client process CPU (user + sys) during the round, seconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_s: Option<f64>,
    /// Over UDP (`-u`): requests given up as lost (no reply within
    /// `--udp-retry`), all connections; the median row has the total.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lost: Option<u64>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub conns: Vec<ConnRow>,
}

fn us(ns: u64) -> f64 {
    ns as f64 / 1e3
}

/// Latency at `percent` (0..=100) in µs; 0 when there is no sample.
pub fn at(h: &Histogram<u64>, percent: f64) -> f64 {
    if h.is_empty() {
        0.0
    } else {
        us(h.value_at_quantile(percent / 100.0))
    }
}

impl Row {
    /// Builds a round's row; also returns the round's merged histogram.
    #[allow(clippy::too_many_arguments)] // one per column of the row
    pub fn from_round(
        round: usize,
        unix_time: u64,
        threads: usize,
        inflight: usize,
        out: &RoundOutcome,
        quantiles: &[f64],
        limit_s: f64,
        cpu_s: Option<f64>,
    ) -> (Row, Histogram<u64>) {
        let mut h = super::engine::new_histogram();
        let mut row = Row {
            round,
            unix_time,
            threads,
            inflight,
            calls: 0,
            secs: 0.0,
            rate: 0.0,
            min_us: 0.0,
            mean_us: 0.0,
            max_us: 0.0,
            p50_us: 0.0,
            p99_us: 0.0,
            p999_us: 0.0,
            quantiles: Vec::new(),
            mbps: 0.0,
            tx_bytes: 0,
            rx_bytes: 0,
            reads: 0,
            writes: 0,
            errors: 0,
            error: None,
            cpu_s,
            lost: None,
            conns: Vec::with_capacity(out.conns.len()),
        };
        let mut max_ns = 0;
        for (i, c) in out.conns.iter().enumerate() {
            h.add(&c.hist).expect("histograms share bounds");
            row.calls += c.calls;
            row.tx_bytes += c.tx_bytes;
            row.rx_bytes += c.rx_bytes;
            row.reads += c.reads;
            row.writes += c.writes;
            if let Some(l) = c.lost {
                *row.lost.get_or_insert(0) += l;
            }
            max_ns = max_ns.max(c.elapsed_ns);
            if let Some(e) = &c.error {
                row.errors += 1;
                if row.error.is_none() {
                    row.error = Some(format!("connection {i}: {e}"));
                }
            }
            row.conns.push(ConnRow { calls: c.calls, secs: c.elapsed_ns as f64 / 1e9, error: c.error.clone() });
        }
        if out.timed_out {
            row.errors += 1;
            row.error.get_or_insert_with(|| format!("round did not finish within {limit_s:.1} s"));
        }
        row.secs = max_ns as f64 / 1e9;
        if row.secs > 0.0 {
            row.rate = row.calls as f64 / row.secs;
            row.mbps = (row.tx_bytes + row.rx_bytes) as f64 * 8.0 / row.secs / 1e6;
        }
        if !h.is_empty() {
            row.min_us = us(h.min());
            row.max_us = us(h.max());
            row.mean_us = h.mean() / 1e3;
        }
        row.p50_us = at(&h, 50.0);
        row.p99_us = at(&h, 99.0);
        row.p999_us = at(&h, 99.9);
        row.quantiles = quantiles.iter().map(|&p| Quantile { percent: p, us: at(&h, p) }).collect();
        (row, h)
    }

    /// The median row: each figure is the median of the rounds' figures
    /// (the mean of the two middle ones for an even count); `errors` is the total.
    pub fn median(rows: &[Row]) -> Row {
        assert!(!rows.is_empty());
        let med = |f: &dyn Fn(&Row) -> f64| median(rows.iter().map(f).collect());
        let first = &rows[0];
        Row {
            round: 0,
            unix_time: rows.last().map_or(0, |r| r.unix_time),
            threads: first.threads,
            inflight: first.inflight,
            calls: med(&|r| r.calls as f64).round() as u64,
            secs: med(&|r| r.secs),
            rate: med(&|r| r.rate),
            min_us: med(&|r| r.min_us),
            mean_us: med(&|r| r.mean_us),
            max_us: med(&|r| r.max_us),
            p50_us: med(&|r| r.p50_us),
            p99_us: med(&|r| r.p99_us),
            p999_us: med(&|r| r.p999_us),
            quantiles: (0..first.quantiles.len())
                .map(|k| Quantile { percent: first.quantiles[k].percent, us: med(&|r| r.quantiles[k].us) })
                .collect(),
            mbps: med(&|r| r.mbps),
            tx_bytes: rows.iter().map(|r| r.tx_bytes).sum(),
            rx_bytes: rows.iter().map(|r| r.rx_bytes).sum(),
            reads: rows.iter().map(|r| r.reads).sum(),
            writes: rows.iter().map(|r| r.writes).sum(),
            errors: rows.iter().map(|r| r.errors).sum(),
            error: rows.iter().find_map(|r| r.error.clone()),
            cpu_s: rows.iter().map(|r| r.cpu_s).sum(),
            lost: rows.iter().map(|r| r.lost).sum(),
            conns: Vec::new(),
        }
    }
}

/// Median of `v` (mean of the two middle values for an even count); 0 if empty.
pub fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn pct_name(p: f64) -> String {
    // 50 -> "50", 99.9 -> "99.9", 4.55 -> "4.55"
    let s = format!("{p:.3}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

const LAT_W: usize = 9;

/// The table header line.
pub fn header(units: &Units, quantiles: &[f64]) -> String {
    let mut s = format!(
        "{:>6} {:>3} {:>5} {:>10} {:>7} {:>10} {:>w$}",
        "round",
        "TD",
        "INF",
        "calls",
        "secs",
        units.rate_col,
        "min_us",
        w = LAT_W
    );
    for &q in quantiles {
        s.push_str(&format!(" {:>w$}", format!("p{}_us", pct_name(q)), w = LAT_W));
    }
    s.push_str(&format!(" {:>w$} {:>8} {:>4}", "max_us", "Mbps", "errs", w = LAT_W));
    s
}

/// One table line; `label` is the round number or `median`.
pub fn line(row: &Row, label: &str) -> String {
    let mut s = format!(
        "{:>6} {:>3} {:>5} {:>10} {:>7.3} {:>10.0} {:>w$.1}",
        label,
        row.threads,
        row.inflight,
        row.calls,
        row.secs,
        row.rate,
        row.min_us,
        w = LAT_W
    );
    for q in &row.quantiles {
        s.push_str(&format!(" {:>w$.1}", q.us, w = LAT_W));
    }
    s.push_str(&format!(" {:>w$.1} {:>8.1} {:>4}", row.max_us, row.mbps, row.errors, w = LAT_W));
    s
}

/// The table's line for a round that failed: its error, no figures (what a
/// failed round counted is not a measurement).
pub fn failed_line(row: &Row, label: &str) -> String {
    format!("{label:>6} FAILED {}", row.error.as_deref().unwrap_or("failed"))
}

/// The summary line of a failed run: what was asked for, `result=FAILED`,
/// and no figures.
pub fn failed_summary_line(units: &Units, target: &str, med: &Row, rounds: usize, errors: usize) -> String {
    format!(
        "summary tool={} target={} j={} a={} rounds={} errors={} result=FAILED",
        units.tool, target, med.threads, med.inflight, rounds, errors
    )
}

/// The one-line `key=value` summary printed last (grep for `^summary `).
#[allow(clippy::too_many_arguments)]
pub fn summary_line(
    units: &Units,
    target: &str,
    med: &Row,
    rounds: usize,
    total_calls: u64,
    all: &Histogram<u64>,
    errors: usize,
) -> String {
    let mut cpu = match med.cpu_s {
        Some(c) if total_calls > 0 => format!(" cpu_us_per_call={:.2}", c * 1e6 / total_calls as f64),
        _ => String::new(),
    };
    if let Some(l) = med.lost {
        cpu.push_str(&format!(" lost={l}"));
    }
    format!(
        "summary tool={} target={} j={} a={} rounds={} calls={} {}={:.0} rtt_us_p50={:.1} rtt_us_p99={:.1} \
         rtt_us_p999={:.1} rtt_us_min={:.1} rtt_us_max={:.1} mbps={:.1}{} errors={} result={}",
        units.tool,
        target,
        med.threads,
        med.inflight,
        rounds,
        total_calls,
        units.rate_key,
        med.rate,
        med.p50_us,
        med.p99_us,
        med.p999_us,
        if all.is_empty() { 0.0 } else { us(all.min()) },
        if all.is_empty() { 0.0 } else { us(all.max()) },
        med.mbps,
        cpu,
        errors,
        if errors == 0 { "ok" } else { "FAILED" }
    )
}

/// Percentiles of all rounds pooled (JSON only).
#[derive(Debug, Clone, Serialize)]
pub struct Pooled {
    pub calls: u64,
    pub min_us: f64,
    pub mean_us: f64,
    pub max_us: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub quantiles: Vec<Quantile>,
}

impl Pooled {
    pub fn new(h: &Histogram<u64>, quantiles: &[f64]) -> Pooled {
        let e = h.is_empty();
        Pooled {
            calls: h.len(),
            min_us: if e { 0.0 } else { us(h.min()) },
            mean_us: if e { 0.0 } else { h.mean() / 1e3 },
            max_us: if e { 0.0 } else { us(h.max()) },
            p50_us: at(h, 50.0),
            p99_us: at(h, 99.0),
            p999_us: at(h, 99.9),
            quantiles: quantiles.iter().map(|&p| Quantile { percent: p, us: at(h, p) }).collect(),
        }
    }
}

/// The `--json` document.
#[derive(Debug, Serialize)]
pub struct Report<C: Serialize> {
    pub tool: &'static str,
    pub target: String,
    pub addrs: Vec<String>,
    pub config: C,
    pub rounds: Vec<Row>,
    /// `null` when the run failed.
    pub median: Option<Row>,
    /// All rounds' RTTs in one histogram; `null` when the run failed.
    pub all: Option<Pooled>,
    pub errors: usize,
    pub ok: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians() {
        assert_eq!(median(vec![]), 0.0);
        assert_eq!(median(vec![3.0]), 3.0);
        assert_eq!(median(vec![5.0, 1.0, 3.0]), 3.0);
        assert_eq!(median(vec![4.0, 1.0, 3.0, 2.0]), 2.5);
    }

    #[test]
    fn percentile_names() {
        assert_eq!(pct_name(50.0), "50");
        assert_eq!(pct_name(99.9), "99.9");
        assert_eq!(pct_name(0.3), "0.3");
        assert_eq!(pct_name(99.99), "99.99");
    }

    #[test]
    fn header_and_line_columns_line_up() {
        let units = Units { tool: "rpctest", rate_col: "RPC/s", rate_key: "rpc_per_s" };
        let q = [50.0, 99.0, 99.9];
        let hdr = header(&units, &q);
        let mut h = crate::cmd::loadgen::engine::new_histogram();
        for v in 1..=1000u64 {
            h.record(v * 1000).unwrap();
        }
        let row = Row {
            round: 1,
            unix_time: 0,
            threads: 1,
            inflight: 32,
            calls: 1000,
            secs: 1.5,
            rate: 666.7,
            min_us: at(&h, 0.0),
            mean_us: 0.0,
            max_us: us(h.max()),
            p50_us: at(&h, 50.0),
            p99_us: at(&h, 99.0),
            p999_us: at(&h, 99.9),
            quantiles: q.iter().map(|&p| Quantile { percent: p, us: at(&h, p) }).collect(),
            mbps: 1.0,
            tx_bytes: 0,
            rx_bytes: 0,
            reads: 0,
            writes: 0,
            errors: 0,
            error: None,
            cpu_s: None,
            lost: None,
            conns: vec![],
        };
        let l = line(&row, "1");
        assert_eq!(hdr.len(), l.len(), "\n{hdr}\n{l}");
        assert_eq!(hdr.split_whitespace().count(), l.split_whitespace().count());
        // Each header word ends where its value ends (right-aligned columns).
        let ends = |s: &str| {
            s.char_indices()
                .filter(|&(i, c)| c != ' ' && s[i + c.len_utf8()..].starts_with(' ') || i + c.len_utf8() == s.len())
                .map(|(i, _)| i)
                .collect::<Vec<_>>()
        };
        assert_eq!(ends(&hdr), ends(&l));
        assert!(hdr.contains("p50_us") && hdr.contains("p99.9_us") && hdr.contains("RPC/s"));
        let p50: f64 = l.split_whitespace().nth(7).unwrap().parse().unwrap();
        assert!((p50 - 500.0).abs() < 1.0, "{l}");
    }
}
