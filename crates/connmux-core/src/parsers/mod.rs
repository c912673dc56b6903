//! Built-in parsers, each a [`Parser`] configured in one line, and
//! [`from_spec`], the spec-string constructor the CLI and the C API use.
//!
//! | spec | parser | framing |
//! |---|---|---|
//! | `len:offset=0,width=4,endian=be,adjust=0,includes_header=false` | [`LengthField`] | length field anywhere (every key optional, defaults shown) |
//! | `l4` | [`LengthField::l4`] | 4-byte big-endian length excluding itself |
//! | `oncrpc`, `oncrpc:strip`, `oncrpc:max_fragments=N` | [`OncRpc`] | RFC 5531 record marking; a multi-fragment record is one message |
//! | `9p` | [`NineP`] | `size[4]` little-endian including itself, ≥ 7 |
//! | `thrift` | [`Thrift`] | framed transport: 4-byte big-endian signed size excluding itself |
//! | `http2` | [`Http2`] | client preface (first message only), then 9-byte frame header + 24-bit length |
//! | `kafka` | [`Kafka`] | 4-byte big-endian signed size excluding itself |
//! | `memcached` | [`Memcached`] | binary protocol: 24-byte header (magic 0x80/0x81), body length at offset 8 |
//!
//! Every parser answers [`Parse::NeedMore`] with the exact number of bytes
//! still missing before it can decide, never panics, checks lengths for
//! overflow, and does not allocate in `parse`. A parser's [`Parser::name`] is
//! its canonical spec: `from_spec(p.name())` builds the same parser.
//!
//! What these parsers do not do: look past the framing (no protocol
//! validation beyond the fields needed to find a message's end), enforce a
//! maximum message size (the stream parser's `max_msg_size` does), or keep
//! state across messages other than HTTP/2's "preface seen".
//!
//! [`Parse::NeedMore`]: crate::parser::Parse::NeedMore

mod http2;
mod kafka;
mod length;
mod memcached;
mod ninep;
mod oncrpc;
mod thrift;

pub use http2::{Http2, FRAME_HEADER_LEN as HTTP2_FRAME_HEADER_LEN, PREFACE as HTTP2_PREFACE};
pub use kafka::Kafka;
pub use length::{Endian, LengthField, LengthFieldError, MAX_OFFSET};
pub use memcached::{Memcached, HEADER_LEN as MEMCACHED_HEADER_LEN, MAGIC_REQUEST, MAGIC_RESPONSE};
pub use ninep::{NineP, MIN_MESSAGE as NINEP_MIN_MESSAGE};
pub use oncrpc::{OncRpc, DEFAULT_MAX_FRAGMENTS};
pub use thrift::Thrift;

use crate::parser::Parser;

/// The accepted spec forms, as shown in every [`SpecError`].
pub const SPEC_FORMS: &str = "len[:offset=N,width=1..8,endian=be|le,adjust=±N,includes_header=true|false], \
l4, oncrpc[:strip][,max_fragments=N], 9p, thrift, http2, kafka, memcached";

/// Why a spec string names no parser. Every message ends with [`SPEC_FORMS`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    /// The spec is empty.
    #[error("empty parser spec; valid forms: {SPEC_FORMS}")]
    Empty,
    /// No parser of this kind.
    #[error("unknown parser kind {kind:?}; valid forms: {SPEC_FORMS}")]
    UnknownKind {
        /// The kind given.
        kind: String,
    },
    /// Options given to a kind that takes none.
    #[error("parser {kind} takes no options (got {options:?}); valid forms: {SPEC_FORMS}")]
    NoOptions {
        /// The kind.
        kind: &'static str,
        /// What followed the colon.
        options: String,
    },
    /// An option the kind does not have (or an empty one).
    #[error("parser {kind} has no option {option:?}; valid forms: {SPEC_FORMS}")]
    UnknownOption {
        /// The kind.
        kind: &'static str,
        /// The option given.
        option: String,
    },
    /// An option given twice.
    #[error("parser {kind}: option {option} given twice; valid forms: {SPEC_FORMS}")]
    DuplicateOption {
        /// The kind.
        kind: &'static str,
        /// The option.
        option: &'static str,
    },
    /// An option's value is not acceptable.
    #[error("parser {kind}: {option}={value:?} is not {expected}; valid forms: {SPEC_FORMS}")]
    BadValue {
        /// The kind.
        kind: &'static str,
        /// The option.
        option: &'static str,
        /// The value given.
        value: String,
        /// What would be accepted.
        expected: &'static str,
    },
}

/// Constructor of a parser kind that takes no options.
type MakeParser = fn() -> Box<dyn Parser>;

/// Builds a parser from its spec string (see the table in the module docs).
///
/// ```
/// use connmux_core::parsers::from_spec;
/// let p = from_spec("len:offset=2,width=2,endian=le").unwrap();
/// assert_eq!(p.name(), "len:offset=2,width=2,endian=le,adjust=0,includes_header=false");
/// assert!(from_spec("oncrpc:strip").is_ok());
/// assert!(from_spec("len:width=9").is_err());
/// ```
pub fn from_spec(spec: &str) -> Result<Box<dyn Parser>, SpecError> {
    let spec = spec.trim();
    if spec.is_empty() {
        return Err(SpecError::Empty);
    }
    let (kind, options) = match spec.split_once(':') {
        Some((k, o)) => (k.trim(), Some(o)),
        None => (spec, None),
    };
    // Kinds without options.
    let fixed: Option<(&'static str, MakeParser)> = match kind {
        "l4" => Some(("l4", || Box::new(LengthField::l4()))),
        "9p" => Some(("9p", || Box::new(NineP::new()))),
        "thrift" => Some(("thrift", || Box::new(Thrift::new()))),
        "http2" => Some(("http2", || Box::new(Http2::new()))),
        "kafka" => Some(("kafka", || Box::new(Kafka::new()))),
        "memcached" => Some(("memcached", || Box::new(Memcached::new()))),
        _ => None,
    };
    if let Some((kind, make)) = fixed {
        return match options {
            None => Ok(make()),
            Some(o) => Err(SpecError::NoOptions { kind, options: o.to_string() }),
        };
    }
    match kind {
        "len" => length_from_options(options),
        "oncrpc" => oncrpc_from_options(options),
        _ => Err(SpecError::UnknownKind { kind: kind.to_string() }),
    }
}

/// Splits `a=b,c,d=e` into (key, value) items; a flag has value `None`.
/// Refuses empty items (`len:` or `len:a=1,,b=2`).
fn options<'a>(
    kind: &'static str,
    opts: Option<&'a str>,
) -> impl Iterator<Item = Result<(&'a str, Option<&'a str>), SpecError>> + 'a {
    opts.into_iter().flat_map(|o| o.split(',')).map(move |item| {
        let item = item.trim();
        if item.is_empty() {
            return Err(SpecError::UnknownOption { kind, option: String::new() });
        }
        Ok(match item.split_once('=') {
            Some((k, v)) => (k.trim(), Some(v.trim())),
            None => (item, None),
        })
    })
}

/// Records that `option` was seen; an option given twice is an error.
fn once(kind: &'static str, option: &'static str, seen: &mut bool) -> Result<(), SpecError> {
    if std::mem::replace(seen, true) {
        return Err(SpecError::DuplicateOption { kind, option });
    }
    Ok(())
}

fn value<'a>(
    kind: &'static str,
    option: &'static str,
    v: Option<&'a str>,
    expected: &'static str,
) -> Result<&'a str, SpecError> {
    v.ok_or_else(|| SpecError::BadValue { kind, option, value: String::new(), expected })
}

fn bad(kind: &'static str, option: &'static str, v: &str, expected: &'static str) -> SpecError {
    SpecError::BadValue { kind, option, value: v.to_string(), expected }
}

fn length_from_options(opts: Option<&str>) -> Result<Box<dyn Parser>, SpecError> {
    const K: &str = "len";
    let (mut offset, mut width, mut endian, mut adjust, mut incl) = (0usize, 4usize, Endian::Big, 0i64, false);
    let mut seen = [false; 5];
    for item in options(K, opts) {
        let (key, v) = item?;
        match key {
            "offset" => {
                once(K, "offset", &mut seen[0])?;
                const E: &str = "an offset 0..=65535";
                let v = value(K, "offset", v, E)?;
                offset = v.parse().ok().filter(|&o| o <= MAX_OFFSET).ok_or_else(|| bad(K, "offset", v, E))?;
            }
            "width" => {
                once(K, "width", &mut seen[1])?;
                const E: &str = "a width 1..=8";
                let v = value(K, "width", v, E)?;
                width = v.parse().ok().filter(|w| (1..=8).contains(w)).ok_or_else(|| bad(K, "width", v, E))?;
            }
            "endian" => {
                once(K, "endian", &mut seen[2])?;
                const E: &str = "be or le";
                let v = value(K, "endian", v, E)?;
                endian = match v {
                    "be" | "big" => Endian::Big,
                    "le" | "little" => Endian::Little,
                    _ => return Err(bad(K, "endian", v, E)),
                };
            }
            "adjust" => {
                once(K, "adjust", &mut seen[3])?;
                const E: &str = "a signed 64-bit integer";
                let v = value(K, "adjust", v, E)?;
                // Accept an explicit '+' sign as well as '-'.
                adjust = v.strip_prefix('+').unwrap_or(v).parse().map_err(|_| bad(K, "adjust", v, E))?;
            }
            "includes_header" => {
                once(K, "includes_header", &mut seen[4])?;
                const E: &str = "true or false";
                let v = value(K, "includes_header", v, E)?;
                incl = match v {
                    "true" => true,
                    "false" => false,
                    _ => return Err(bad(K, "includes_header", v, E)),
                };
            }
            other => return Err(SpecError::UnknownOption { kind: K, option: other.to_string() }),
        }
    }
    match LengthField::new(offset, width, endian, adjust, incl) {
        Ok(p) => Ok(Box::new(p)),
        // Both ranges were checked above; mapped rather than unwrapped all the same.
        Err(LengthFieldError::Width(w)) => Err(bad(K, "width", &w.to_string(), "a width 1..=8")),
        Err(LengthFieldError::Offset(o)) => Err(bad(K, "offset", &o.to_string(), "an offset 0..=65535")),
    }
}

fn oncrpc_from_options(opts: Option<&str>) -> Result<Box<dyn Parser>, SpecError> {
    const K: &str = "oncrpc";
    let (mut strip, mut max) = (false, DEFAULT_MAX_FRAGMENTS);
    let mut seen = [false; 2];
    for item in options(K, opts) {
        match item? {
            ("strip", None) => {
                once(K, "strip", &mut seen[0])?;
                strip = true;
            }
            ("max_fragments", v) => {
                once(K, "max_fragments", &mut seen[1])?;
                const E: &str = "a fragment count ≥ 1";
                let v = value(K, "max_fragments", v, E)?;
                max = v.parse().ok().filter(|&n| n >= 1).ok_or_else(|| bad(K, "max_fragments", v, E))?;
            }
            (other, v) => {
                let option = match v {
                    Some(v) => format!("{other}={v}"),
                    None => other.to_string(),
                };
                return Err(SpecError::UnknownOption { kind: K, option });
            }
        }
    }
    Ok(Box::new(OncRpc::with_max_fragments(strip, max)))
}
