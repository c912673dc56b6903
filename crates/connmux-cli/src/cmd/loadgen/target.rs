//! Command-line values shared by the load generators: the `[user@]host[:port]`
//! target, ksf-style numbers (`9M`, `64k`), CPU lists and quantile lists.

use std::net::{SocketAddr, ToSocketAddrs};

/// Where the load goes: the name as given and every address it resolved to.
#[derive(Debug, Clone)]
pub struct Target {
    /// `host:port` as the user wrote it (without any `user@`), port filled in.
    pub name: String,
    /// Resolved addresses, in resolver order; connections try them in turn.
    pub addrs: Vec<SocketAddr>,
}

/// Splits `[user@]host[:port]` into host and port. IPv6 literals go in brackets
/// when a port follows (`[::1]:62049`); a bare `::1` is taken as a host alone.
pub fn split_host_port(spec: &str, default_port: u16) -> Result<(String, u16), String> {
    // ksf accepts and ignores a `user@` prefix; so do we.
    let spec = spec.rsplit_once('@').map_or(spec, |(_, h)| h);
    if spec.is_empty() {
        return Err("empty host".into());
    }
    let parse_port = |p: &str| -> Result<u16, String> {
        match p.parse::<u16>() {
            Ok(0) | Err(_) => Err(format!("bad port {p:?}")),
            Ok(n) => Ok(n),
        }
    };
    if let Some(rest) = spec.strip_prefix('[') {
        let (host, after) = rest.split_once(']').ok_or_else(|| format!("unclosed '[' in {spec:?}"))?;
        if host.is_empty() {
            return Err(format!("empty host in {spec:?}"));
        }
        return match after {
            "" => Ok((host.to_string(), default_port)),
            p => match p.strip_prefix(':') {
                Some(p) => Ok((host.to_string(), parse_port(p)?)),
                None => Err(format!("junk after ']' in {spec:?}")),
            },
        };
    }
    match spec.matches(':').count() {
        0 => Ok((spec.to_string(), default_port)),
        1 => {
            let (h, p) = spec.split_once(':').expect("one colon");
            if h.is_empty() {
                return Err(format!("empty host in {spec:?}"));
            }
            Ok((h.to_string(), parse_port(p)?))
        }
        // More than one colon and no brackets: an IPv6 address without a port.
        _ => Ok((spec.to_string(), default_port)),
    }
}

impl Target {
    /// Parses and resolves `spec` (names go through the system resolver, so
    /// `/etc/hosts` names such as `localhost` work).
    pub fn resolve(spec: &str, default_port: u16) -> anyhow::Result<Target> {
        let (host, port) = split_host_port(spec, default_port).map_err(|e| anyhow::anyhow!("target {spec:?}: {e}"))?;
        let addrs: Vec<SocketAddr> = (host.as_str(), port)
            .to_socket_addrs()
            .map_err(|e| anyhow::anyhow!("cannot resolve {host:?}: {e}"))?
            .collect();
        if addrs.is_empty() {
            anyhow::bail!("{host:?} resolved to no address");
        }
        let name = if host.contains(':') { format!("[{host}]:{port}") } else { format!("{host}:{port}") };
        Ok(Target { name, addrs })
    }
}

/// Parses a count the way ksf's tools do: a number with an optional one-letter
/// suffix, lowercase `k m g t` = powers of 1024, uppercase `K M G T` = powers of
/// 1000 (so `-c9M` is 9 000 000 and `-l64k` is 65 536). Fractions are allowed
/// when the result is whole (`1.5K`).
pub fn parse_count(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (num, mult) = match s.chars().last() {
        Some(c) if c.is_ascii_alphabetic() => {
            let m: f64 = match c {
                'k' => 1024.0,
                'm' => 1024f64.powi(2),
                'g' => 1024f64.powi(3),
                't' => 1024f64.powi(4),
                'K' => 1e3,
                'M' => 1e6,
                'G' => 1e9,
                'T' => 1e12,
                _ => return Err(format!("unknown suffix {c:?} in {s:?} (k m g t = 1024^n, K M G T = 1000^n)")),
            };
            (&s[..s.len() - 1], m)
        }
        _ => (s, 1.0),
    };
    if let Ok(n) = num.parse::<u64>() {
        return (n as f64 * mult <= u64::MAX as f64)
            .then(|| n.saturating_mul(mult as u64))
            .ok_or_else(|| format!("{s:?} is too large"));
    }
    let v: f64 = num.parse().map_err(|_| format!("not a number: {s:?}"))?;
    let v = v * mult;
    if !v.is_finite() || v < 0.0 || v > u64::MAX as f64 || v.fract() != 0.0 {
        return Err(format!("{s:?} is not a whole non-negative count"));
    }
    Ok(v as u64)
}

/// Parses a duration in seconds (`0.5`, `10`); must be positive and at most a day.
pub fn parse_seconds(s: &str) -> Result<f64, String> {
    let v: f64 = s.trim().parse().map_err(|_| format!("not a number of seconds: {s:?}"))?;
    if !(v > 0.0 && v <= 86_400.0) {
        return Err(format!("seconds must be in (0, 86400], got {s:?}"));
    }
    Ok(v)
}

/// Parses a CPU list: `0`, `0,2`, `0-3`, `0-1,4`.
pub fn parse_cpu_list(s: &str) -> Result<Vec<usize>, String> {
    let mut cpus = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let num = |x: &str| x.trim().parse::<usize>().map_err(|_| format!("bad CPU number {x:?} in {s:?}"));
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (num(a)?, num(b)?);
                if a > b || b - a >= 4096 {
                    return Err(format!("bad CPU range {part:?}"));
                }
                cpus.extend(a..=b);
            }
            None => cpus.push(num(part)?),
        }
    }
    if cpus.is_empty() {
        return Err("empty CPU list".into());
    }
    Ok(cpus)
}

/// Parses a quantile list in percent: `50,99,99.9`. Sorted, deduplicated,
/// each in [0, 100], at most 16 (as ksf's `-q`).
pub fn parse_quantiles(s: &str) -> Result<Vec<f64>, String> {
    let mut q = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let v: f64 = part.parse().map_err(|_| format!("bad percentile {part:?}"))?;
        if !(0.0..=100.0).contains(&v) {
            return Err(format!("percentile {part} is outside 0..100"));
        }
        q.push(v);
    }
    q.sort_by(f64::total_cmp);
    q.dedup();
    if q.is_empty() || q.len() > 16 {
        return Err("give 1 to 16 percentiles".into());
    }
    Ok(q)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_port_forms() {
        assert_eq!(split_host_port("10.0.0.1", 62049).unwrap(), ("10.0.0.1".into(), 62049));
        assert_eq!(split_host_port("h:2049", 62049).unwrap(), ("h".into(), 2049));
        assert_eq!(split_host_port("me@h:2049", 62049).unwrap(), ("h".into(), 2049));
        assert_eq!(split_host_port("[::1]:7", 1).unwrap(), ("::1".into(), 7));
        assert_eq!(split_host_port("[::1]", 9).unwrap(), ("::1".into(), 9));
        assert_eq!(split_host_port("::1", 9).unwrap(), ("::1".into(), 9));
        assert!(split_host_port("h:0", 1).is_err());
        assert!(split_host_port("h:70000", 1).is_err());
        assert!(split_host_port(":5", 1).is_err());
        assert!(split_host_port("[::1", 1).is_err());
        assert!(split_host_port("", 1).is_err());
    }

    #[test]
    fn resolves_names_and_literals() {
        let t = Target::resolve("localhost:4000", 1).unwrap();
        assert!(t.addrs.iter().all(|a| a.port() == 4000 && a.ip().is_loopback()));
        let t = Target::resolve("127.0.0.1", 62049).unwrap();
        assert_eq!(t.addrs, vec!["127.0.0.1:62049".parse().unwrap()]);
        assert_eq!(t.name, "127.0.0.1:62049");
    }

    #[test]
    fn ksf_counts() {
        assert_eq!(parse_count("9M").unwrap(), 9_000_000);
        assert_eq!(parse_count("64k").unwrap(), 65_536);
        assert_eq!(parse_count("2m").unwrap(), 2 * 1024 * 1024);
        assert_eq!(parse_count("1.5K").unwrap(), 1500);
        assert_eq!(parse_count("0").unwrap(), 0);
        assert_eq!(parse_count("123").unwrap(), 123);
        assert!(parse_count("1.5").is_err());
        assert!(parse_count("-1").is_err());
        assert!(parse_count("5x").is_err());
        assert!(parse_count("100000000T").is_err());
    }

    #[test]
    fn cpu_and_quantile_lists() {
        assert_eq!(parse_cpu_list("0-2,5").unwrap(), vec![0, 1, 2, 5]);
        assert!(parse_cpu_list("3-1").is_err());
        assert!(parse_cpu_list("").is_err());
        assert_eq!(parse_quantiles("99.9,50,99,50").unwrap(), vec![50.0, 99.0, 99.9]);
        assert!(parse_quantiles("101").is_err());
    }
}
