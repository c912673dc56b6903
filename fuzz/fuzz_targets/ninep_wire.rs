//! 9P2000.L wire formats: the request decoder and encoder, the reply
//! decoder, and the core's 9P framing beside them.
//!
//! Input: one candidate message (`size[4] type[1] tag[2] body`).
//!
//! Checked:
//! - `Tmsg::decode` answers a request or a `WireError`, and `Rmsg::decode`
//!   a reply or a `WireError`; neither panics;
//! - a decoded request encodes to a message that decodes to the same tag and
//!   request, and to the very bytes it came from (but a Tfsync without its
//!   optional datasync, which encodes with it);
//! - a decoded request's type and tag are the header's (`Header`,
//!   `peek_tag`), and the core's 9P parser (`parsers::NineP`, which frames
//!   what the 9p-server serves) takes the same bytes as one message of
//!   exactly their length; a decoded reply's tag is `peek_tag`'s too.
#![no_main]

use connmux_9p::header::peek_tag;
use connmux_9p::{Header, Rmsg, Tmsg};
use connmux_core::parser::{Parse, Parser};
use connmux_core::parsers::NineP;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok((tag, req)) = Tmsg::decode(data) {
        let h = Header::new_checked(data).expect("a decoded request has a header");
        assert_eq!(h.msg_type(), req.msg_type());
        assert_eq!((h.tag(), peek_tag(data)), (tag, Some(tag)));
        assert_eq!(NineP::new().parse(data), Parse::Length(data.len()), "the core frames it whole");
        let mut out = Vec::new();
        req.encode(tag, &mut out);
        let again = Tmsg::decode(&out).unwrap_or_else(|e| panic!("{req:?} encoded does not decode: {e}"));
        assert_eq!(again, (tag, req.clone()));
        let short_fsync = matches!(req, Tmsg::Fsync { .. }) && data.len() + 4 == out.len();
        if !short_fsync {
            assert_eq!(out, data, "{req:?} encodes to other bytes");
        }
    }
    if let Ok((tag, _)) = Rmsg::decode(data) {
        assert_eq!(peek_tag(data), Some(tag));
    }
});
