//! The fixed header of every 9P message.
//!
//! ```text
//! offset  field
//!      0  size[4]   the whole message, itself included (little-endian)
//!      4  type[1]
//!      5  tag[2]
//!      7  body
//! ```

use crate::wire::WireError;

/// Named offsets of the header.
pub mod field {
    /// `size[4]`.
    pub const SIZE: usize = 0;
    /// `type[1]`.
    pub const TYPE: usize = 4;
    /// `tag[2]`.
    pub const TAG: usize = 5;
    /// The first byte of the body.
    pub const BODY: usize = 7;
}

/// Bytes of the header.
pub const HEADER_LEN: usize = field::BODY;
/// The tag of Tversion.
pub const NOTAG: u16 = 0xffff;
/// "No fid" (Tattach's afid).
pub const NOFID: u32 = 0xffff_ffff;

/// A message type number: open, so an unknown number is a value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MsgType(pub u8);

#[allow(missing_docs)]
impl MsgType {
    pub const RLERROR: MsgType = MsgType(7);
    pub const TSTATFS: MsgType = MsgType(8);
    pub const RSTATFS: MsgType = MsgType(9);
    pub const TLOPEN: MsgType = MsgType(12);
    pub const RLOPEN: MsgType = MsgType(13);
    pub const TLCREATE: MsgType = MsgType(14);
    pub const RLCREATE: MsgType = MsgType(15);
    pub const TSYMLINK: MsgType = MsgType(16);
    pub const RSYMLINK: MsgType = MsgType(17);
    pub const TMKNOD: MsgType = MsgType(18);
    pub const RMKNOD: MsgType = MsgType(19);
    pub const TRENAME: MsgType = MsgType(20);
    pub const RRENAME: MsgType = MsgType(21);
    pub const TREADLINK: MsgType = MsgType(22);
    pub const RREADLINK: MsgType = MsgType(23);
    pub const TGETATTR: MsgType = MsgType(24);
    pub const RGETATTR: MsgType = MsgType(25);
    pub const TSETATTR: MsgType = MsgType(26);
    pub const RSETATTR: MsgType = MsgType(27);
    pub const TXATTRWALK: MsgType = MsgType(30);
    pub const RXATTRWALK: MsgType = MsgType(31);
    pub const TXATTRCREATE: MsgType = MsgType(32);
    pub const RXATTRCREATE: MsgType = MsgType(33);
    pub const TREADDIR: MsgType = MsgType(40);
    pub const RREADDIR: MsgType = MsgType(41);
    pub const TFSYNC: MsgType = MsgType(50);
    pub const RFSYNC: MsgType = MsgType(51);
    pub const TLOCK: MsgType = MsgType(52);
    pub const RLOCK: MsgType = MsgType(53);
    pub const TGETLOCK: MsgType = MsgType(54);
    pub const RGETLOCK: MsgType = MsgType(55);
    pub const TLINK: MsgType = MsgType(70);
    pub const RLINK: MsgType = MsgType(71);
    pub const TMKDIR: MsgType = MsgType(72);
    pub const RMKDIR: MsgType = MsgType(73);
    pub const TRENAMEAT: MsgType = MsgType(74);
    pub const RRENAMEAT: MsgType = MsgType(75);
    pub const TUNLINKAT: MsgType = MsgType(76);
    pub const RUNLINKAT: MsgType = MsgType(77);
    pub const TVERSION: MsgType = MsgType(100);
    pub const RVERSION: MsgType = MsgType(101);
    pub const TAUTH: MsgType = MsgType(102);
    pub const RAUTH: MsgType = MsgType(103);
    pub const TATTACH: MsgType = MsgType(104);
    pub const RATTACH: MsgType = MsgType(105);
    pub const TFLUSH: MsgType = MsgType(108);
    pub const RFLUSH: MsgType = MsgType(109);
    pub const TWALK: MsgType = MsgType(110);
    pub const RWALK: MsgType = MsgType(111);
    pub const TREAD: MsgType = MsgType(116);
    pub const RREAD: MsgType = MsgType(117);
    pub const TWRITE: MsgType = MsgType(118);
    pub const RWRITE: MsgType = MsgType(119);
    pub const TCLUNK: MsgType = MsgType(120);
    pub const RCLUNK: MsgType = MsgType(121);
    pub const TREMOVE: MsgType = MsgType(122);
    pub const RREMOVE: MsgType = MsgType(123);
}

/// A checked view of the header of one whole message.
#[derive(Clone, Copy, Debug)]
pub struct Header<'a> {
    buf: &'a [u8],
}

impl<'a> Header<'a> {
    /// Checks that `buf` is one whole message: at least the header, and a
    /// size field equal to its length.
    pub fn new_checked(buf: &'a [u8]) -> Result<Self, WireError> {
        if buf.len() < HEADER_LEN {
            return Err(WireError::Truncated { at: 0, need: HEADER_LEN, have: buf.len() });
        }
        let size = u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]);
        if size as usize != buf.len() {
            return Err(WireError::Size { size, have: buf.len() });
        }
        Ok(Header { buf })
    }
    /// The type.
    pub fn msg_type(&self) -> MsgType {
        MsgType(self.buf[field::TYPE])
    }
    /// The tag.
    pub fn tag(&self) -> u16 {
        u16::from_le_bytes([self.buf[field::TAG], self.buf[field::TAG + 1]])
    }
    /// The whole message.
    pub fn bytes(&self) -> &'a [u8] {
        self.buf
    }
    /// The body (after the header).
    pub fn body(&self) -> &'a [u8] {
        &self.buf[field::BODY..]
    }
}

/// The tag of a message whose header may be all that is valid (to answer a
/// malformed request with Rlerror): `None` when even the header is short.
pub fn peek_tag(buf: &[u8]) -> Option<u16> {
    Some(u16::from_le_bytes([*buf.get(field::TAG)?, *buf.get(field::TAG + 1)?]))
}
