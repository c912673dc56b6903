//! `connmux parse`: split a byte stream (a file or stdin) into messages with a
//! built-in parser or a BPF parser program, and say where each message is and
//! why the stream stopped.
//!
//! This is how a parser is checked against a capture before it is deployed:
//! the bytes go through the same stream parser a psock of the mux uses
//! ([`connmux_core::stream::StreamParser`]), with the same size limit, so a
//! message boundary, a refusal or a "too big" here is exactly what the mux
//! would decide on that stream.
//!
//! Output, one line per message, then one line with the reason it stopped:
//!
//! ```text
//! offset=0 len=44
//! offset=44 len=52
//! end: on a message boundary after 2 messages, 96 bytes
//! ```
//!
//! With `--json`, one JSON object per line instead
//! (`{"offset":0,"len":44}` … `{"end":"boundary","messages":2,"bytes":96}`).
//! When a parser changes what the application receives (`oncrpc:strip` drops
//! the record marks), the message line also shows `delivered=N`.
//!
//! What it does not do: look inside messages, apply an assembly timeout
//! (input is not timed), or steer messages (that needs KCM sockets).

use std::io::Read;
use std::path::PathBuf;

use anyhow::Context;
use connmux_core::mux::{MuxConfig, RxError};
use connmux_core::parsers::from_spec;
use connmux_core::stream::{StreamLimits, StreamParser};
use connmux_core::{Parser, Timestamp};

/// Exit status: the input ended on a message boundary (empty input included).
pub const EXIT_BOUNDARY: i32 = 0;
// Exit status 1 (the input could not be read, the parser could not be built)
// comes from `main` for any error returned; 2 is clap's for a bad command line.
/// Exit status: the input ended inside a message.
pub const EXIT_MID_MESSAGE: i32 = 3;
/// Exit status: the stream was refused (parser error, bad length, too big).
pub const EXIT_REFUSED: i32 = 4;

/// Bytes read from the input at a time: the stream parser holds at most one
/// partial message plus this, whatever the input's size.
const CHUNK: usize = 64 << 10;

#[derive(clap::Args, Debug)]
#[command(after_help = "\
Exit status:
  0  the input ended on a message boundary (or was empty)
  1  the input could not be read or the parser could not be loaded
  2  bad command line
  3  the input ended in the middle of a message
  4  the stream was refused: the parser's error, a length not past the bytes
     already gathered, or a message larger than --max-msg")]
pub struct Args {
    /// Built-in parser spec: l4,
    /// len[:offset=N,width=1..8,endian=be|le,adjust=±N,includes_header=true|false],
    /// oncrpc[:strip][,max_fragments=N], 9p, thrift, http2, kafka, memcached.
    #[arg(long, value_name = "SPEC", default_value = "l4", conflicts_with = "bpf")]
    pub parser: String,
    /// A BPF parser program: an ELF object from `clang -target bpf -O2 -c`
    /// (its ELF magic is checked first; at most 16 MiB is read).
    #[arg(long, value_name = "FILE.o")]
    pub bpf: Option<PathBuf>,
    /// The program's section or function in the object (needed when it holds several).
    #[arg(long, value_name = "NAME", requires = "bpf")]
    pub section: Option<String>,
    /// Largest message accepted, in bytes (K and M suffixes: 1024-based).
    /// Default: the mux's, 1M (AF_KCM: the TCP socket's SO_RCVBUF).
    #[arg(long, value_name = "N", value_parser = parse_size)]
    pub max_msg: Option<usize>,
    /// One JSON object per line instead of text.
    #[arg(long)]
    pub json: bool,
    /// Print only the final line (the reason the stream stopped).
    #[arg(long, short)]
    pub quiet: bool,
    /// The byte stream (default: standard input; `-` also means standard input).
    pub input: Option<PathBuf>,
}

/// `123`, `64K`, `1M` (1024-based).
fn parse_size(s: &str) -> Result<usize, String> {
    let t = s.trim();
    let (digits, mult) = match t.as_bytes().last() {
        Some(b'k' | b'K') => (&t[..t.len() - 1], 1usize << 10),
        Some(b'm' | b'M') => (&t[..t.len() - 1], 1usize << 20),
        _ => (t, 1),
    };
    let n: usize = digits.parse().map_err(|_| format!("{s:?} is not a size (e.g. 4096, 64K, 1M)"))?;
    match n.checked_mul(mult) {
        Some(v) if v > 0 => Ok(v),
        Some(_) => Err("the size must be at least 1".into()),
        None => Err(format!("{s:?} is too large")),
    }
}

/// Why the stream stopped.
#[derive(Debug)]
enum End {
    Boundary,
    MidMessage { buffered: usize, need: Option<usize> },
    Refused(RxError),
}

/// Where each message is, and how it ended. `emit` gets (offset, wire length,
/// delivered length) for each message as it is found.
struct Scan {
    messages: u64,
    /// Wire bytes of complete messages: the offset of the next message.
    offset: u64,
    end: End,
}

fn scan(
    parser: Box<dyn Parser>,
    max_msg: usize,
    input: &mut dyn Read,
    mut emit: impl FnMut(u64, u64, usize) -> std::io::Result<()>,
) -> anyhow::Result<Scan> {
    let limits = StreamLimits { max_msg_size: max_msg, assembly_timeout: None, read_ahead: CHUNK };
    let mut sp = StreamParser::new(parser, limits);
    let mut buf = vec![0u8; CHUNK];
    let mut messages = 0u64;
    let mut offset = 0u64;
    loop {
        let n = match input.read(&mut buf) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e).context("reading the input"),
        };
        if n == 0 {
            break;
        }
        sp.feed(&buf[..n]);
        // Each message consumes at least one byte, so this ends within the
        // bytes buffered.
        loop {
            let before = sp.stats().bytes;
            match sp.next_msg(Timestamp::ZERO) {
                Ok(Some(msg)) => {
                    let wire = sp.stats().bytes - before;
                    emit(offset, wire, msg.len()).context("writing the output")?;
                    messages += 1;
                    offset += wire;
                }
                Ok(None) => break,
                Err(e) => return Ok(Scan { messages, offset, end: End::Refused(e) }),
            }
        }
    }
    let end = match sp.buffered() {
        0 => End::Boundary,
        buffered => End::MidMessage { buffered, need: sp.need() },
    };
    Ok(Scan { messages, offset, end })
}

/// "1 message", "2 messages".
fn count(n: u64) -> String {
    format!("{n} message{}", if n == 1 { "" } else { "s" })
}

fn rx_kind(e: &RxError) -> &'static str {
    match e {
        RxError::TooBig { .. } => "too-big",
        RxError::BadLength { .. } => "bad-length",
        RxError::Parser(_) => "parser",
        RxError::Timeout => "timeout",
        RxError::Tls(_) => "tls",
        RxError::MemLimit { .. } => "mem-limit",
        RxError::IdleTimeout => "idle-timeout",
        RxError::HandshakeTimeout => "handshake-timeout",
    }
}

pub fn run(a: Args) -> anyhow::Result<i32> {
    let parser: Box<dyn Parser> = match &a.bpf {
        Some(path) => Box::new(
            connmux_bpf::BpfParser::from_elf_file(path, a.section.as_deref())
                .with_context(|| format!("loading the BPF parser {}", path.display()))?,
        ),
        None => from_spec(&a.parser)?,
    };
    let max_msg = a.max_msg.unwrap_or_else(|| MuxConfig::default().max_msg_size);
    let mut input: Box<dyn Read> = match &a.input {
        Some(p) if p.as_os_str() != "-" => {
            Box::new(std::fs::File::open(p).with_context(|| format!("opening {}", p.display()))?)
        }
        _ => Box::new(std::io::stdin().lock()),
    };
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    use std::io::Write as _;
    let (json, quiet) = (a.json, a.quiet);
    let s = scan(parser, max_msg, &mut input, |offset, len, delivered| {
        if quiet {
            return Ok(());
        }
        let stripped = delivered as u64 != len;
        if json {
            let mut v = serde_json::json!({ "offset": offset, "len": len });
            if stripped {
                v["delivered"] = delivered.into();
            }
            writeln!(out, "{v}")
        } else if stripped {
            writeln!(out, "offset={offset} len={len} delivered={delivered}")
        } else {
            writeln!(out, "offset={offset} len={len}")
        }
    })?;
    let (messages, bytes) = (s.messages, s.offset);
    let code = match &s.end {
        End::Boundary => {
            if json {
                let v = serde_json::json!({ "end": "boundary", "messages": messages, "bytes": bytes });
                writeln!(out, "{v}")?;
            } else {
                writeln!(out, "end: on a message boundary after {}, {bytes} bytes", count(messages))?;
            }
            EXIT_BOUNDARY
        }
        End::MidMessage { buffered, need } => {
            if json {
                let v = serde_json::json!({
                    "end": "mid-message", "messages": messages, "bytes": bytes,
                    "offset": bytes, "buffered": buffered, "need": need,
                });
                writeln!(out, "{v}")?;
            } else {
                let need = match need {
                    Some(n) => format!(", at least {n} more needed"),
                    None => String::new(),
                };
                writeln!(
                    out,
                    "end: input ended mid-message at offset {bytes}: {buffered} bytes of the message{need} \
                     (after {})",
                    count(messages)
                )?;
            }
            EXIT_MID_MESSAGE
        }
        End::Refused(e) => {
            if json {
                let v = serde_json::json!({
                    "end": "refused", "messages": messages, "bytes": bytes, "offset": bytes,
                    "kind": rx_kind(e), "error": e.to_string(), "errno": e.errno(),
                });
                writeln!(out, "{v}")?;
            } else {
                writeln!(out, "end: refused at offset {bytes}: {e} (errno {}) (after {})", e.errno(), count(messages))?;
            }
            EXIT_REFUSED
        }
    };
    out.flush()?;
    Ok(code)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64K"), Ok(64 << 10));
        assert_eq!(parse_size("2m"), Ok(2 << 20));
        assert!(parse_size("0").is_err());
        assert!(parse_size("x").is_err());
        assert!(parse_size("99999999999999999999M").is_err());
    }
}
