//! Parser programs for the kernel: offset-correct BPF generated from a parser
//! spec, or a user's ELF program rewritten to read from the message start.
//!
//! KCM runs the parser on strparser's head skb, whose data begins at the start
//! of the TCP segment where the message begins, not at the message's first
//! byte (kcm-semantics 2.1). A program that reads its length at a fixed
//! position mis-frames every message that shares a segment with the one
//! before it. Every program built here therefore starts with the same prelude:
//!
//! 1. `seq0`: the TCP sequence number of `skb->data[0]`, read from the TCP
//!    header through the network header (`LD_ABS`/`LD_IND` at `SKF_NET_OFF`);
//! 2. `start`: the first byte of the current message, kept in a one-entry
//!    array map (`{ u32 next; u32 valid; }`) as the end of the previous
//!    message; the very first message starts at `seq0`;
//! 3. `r9 = start - seq0`, the message's offset inside the skb.
//!
//! The body reads the message's bytes at `r9 + k`, and every exit goes through
//! an epilogue that, for a length `L > 0`, stores `next = start + L`. A read
//! past the available bytes ends the program with 0 ("need more") before any
//! state changes, so the same message can be parsed again with more data.
//!
//! Limits, shared by every program here: one program and map per attached
//! connection; nothing may have been read from the connection before attach;
//! IPv4, or IPv6 without extension headers; an skb rebuilt by `tcp_collapse()`
//! under receive-memory pressure has no network header (parsing would stall).

use connmux_bpf::insn::{alu, class, jmp, mode, size, src};
use connmux_bpf::Insn;

use crate::KernelError;

/// Bytes of the one-entry state map's value: `{ u32 next; u32 valid; }`.
pub const STATE_SIZE: u32 = 8;
/// `SKF_NET_OFF`: `LD_ABS`/`LD_IND` offsets from here read the network header.
const SKF_NET_OFF: i32 = -0x100000;
/// `BPF_PSEUDO_MAP_FD` in `src` of an `ld_imm64`.
const PSEUDO_MAP_FD: u8 = 1;
/// `bpf_map_lookup_elem`.
const FN_MAP_LOOKUP: i32 = 1;
/// `bpf_skb_load_bytes`.
const FN_SKB_LOAD_BYTES: i32 = 26;
/// The largest length a program returns: above any SO_RCVBUF, so the kernel
/// answers EMSGSIZE, and still positive as an int.
const TOO_BIG: i32 = i32::MAX;
/// EPROTO, returned negated for a length shorter than its header.
const EPROTO: i32 = 71;

/// What a parser spec becomes in the kernel: a length field read at the
/// message start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldSpec {
    pub offset: usize,
    pub width: usize,
    pub little_endian: bool,
    pub adjust: i64,
    pub includes_header: bool,
    /// Smallest valid total length (the header, or more: 9P says 7).
    pub min_len: usize,
    /// The field is signed (Thrift, Kafka): a value with the top bit set is refused.
    pub signed: bool,
    /// The spec it came from.
    pub name: String,
}

impl FieldSpec {
    /// The kernel form of a spec accepted by `connmux_core::parsers::from_spec`.
    /// Specs whose framing is not a single length field (ONC RPC record
    /// marking, HTTP/2's preface, memcached's magic check) are refused.
    pub fn from_spec(spec: &str) -> Result<FieldSpec, KernelError> {
        let parser = connmux_core::parsers::from_spec(spec).map_err(|e| KernelError::Spec(e.to_string()))?;
        let name = parser.name().to_owned();
        let fixed = |offset, width, little_endian, includes_header, min_len, signed| FieldSpec {
            offset,
            width,
            little_endian,
            adjust: 0,
            includes_header,
            min_len,
            signed,
            name: name.clone(),
        };
        match name.split_once(':').map_or(name.as_str(), |(k, _)| k) {
            "l4" => Ok(fixed(0, 4, false, false, 4, false)),
            "9p" => Ok(fixed(0, 4, true, true, connmux_core::parsers::NINEP_MIN_MESSAGE, false)),
            "thrift" | "kafka" => Ok(fixed(0, 4, false, false, 4, true)),
            "len" => {
                // The canonical name spells every option.
                let opts = name.split_once(':').map(|(_, o)| o).unwrap_or("");
                let mut f = fixed(0, 4, false, false, 0, false);
                for item in opts.split(',') {
                    let (k, v) = item.split_once('=').unwrap_or((item, ""));
                    let bad = || KernelError::Spec(format!("unexpected option {item:?} in {name}"));
                    match k {
                        "offset" => f.offset = v.parse().map_err(|_| bad())?,
                        "width" => f.width = v.parse().map_err(|_| bad())?,
                        "endian" => f.little_endian = v == "le",
                        "adjust" => f.adjust = v.parse().map_err(|_| bad())?,
                        "includes_header" => f.includes_header = v == "true",
                        _ => return Err(bad()),
                    }
                }
                f.min_len = f.offset + f.width;
                Ok(f)
            }
            _ => Err(KernelError::UnsupportedParser(name)),
        }
    }

    fn header(&self) -> usize {
        self.offset + self.width
    }
}

/// A small assembler with forward labels.
struct Asm {
    insns: Vec<Insn>,
    /// (instruction index, label) of jumps to patch.
    fixups: Vec<(usize, usize)>,
    labels: Vec<Option<usize>>,
}

impl Asm {
    fn new() -> Asm {
        Asm { insns: Vec::new(), fixups: Vec::new(), labels: Vec::new() }
    }
    fn label(&mut self) -> usize {
        self.labels.push(None);
        self.labels.len() - 1
    }
    fn bind(&mut self, l: usize) {
        self.labels[l] = Some(self.insns.len());
    }
    fn emit(&mut self, i: Insn) {
        self.insns.push(i);
    }
    fn jump(&mut self, i: Insn, target: usize) {
        self.fixups.push((self.insns.len(), target));
        self.insns.push(i);
    }
    fn ld_map_fd(&mut self, dst: u8, fd: i32) {
        self.emit(Insn::new(class::LD | mode::IMM | size::DW, dst, PSEUDO_MAP_FD, 0, fd));
        self.emit(Insn::new(0, 0, 0, 0, 0));
    }
    fn ld_imm64(&mut self, dst: u8, v: i64) {
        self.emit(Insn::new(class::LD | mode::IMM | size::DW, dst, 0, 0, v as i32));
        self.emit(Insn::new(0, 0, 0, 0, (v >> 32) as i32));
    }
    fn finish(mut self) -> Vec<Insn> {
        for (at, l) in self.fixups.drain(..) {
            let target = self.labels[l].expect("label bound");
            let off = target as i64 - at as i64 - 1;
            let i = self.insns[at];
            self.insns[at] = Insn::new(i.code, i.dst, i.src, off as i16, i.imm);
        }
        self.insns
    }
}

fn alu64_k(op: u8, dst: u8, imm: i32) -> Insn {
    Insn::new(class::ALU64 | op | src::K, dst, 0, 0, imm)
}
fn alu64_x(op: u8, dst: u8, s: u8) -> Insn {
    Insn::new(class::ALU64 | op | src::X, dst, s, 0, 0)
}
fn alu32_x(op: u8, dst: u8, s: u8) -> Insn {
    Insn::new(class::ALU | op | src::X, dst, s, 0, 0)
}
fn jmp_k(op: u8, dst: u8, imm: i32) -> Insn {
    Insn::new(class::JMP | op | src::K, dst, 0, 0, imm)
}
fn ld_ind(sz: u8, s: u8, imm: i32) -> Insn {
    Insn::new(class::LD | mode::IND | sz, 0, s, 0, imm)
}
fn ldx(sz: u8, dst: u8, s: u8, off: i16) -> Insn {
    Insn::new(class::LDX | mode::MEM | sz, dst, s, off, 0)
}
fn stx(sz: u8, dst: u8, s: u8, off: i16) -> Insn {
    Insn::new(class::STX | mode::MEM | sz, dst, s, off, 0)
}
fn st(sz: u8, dst: u8, off: i16, imm: i32) -> Insn {
    Insn::new(class::ST | mode::MEM | sz, dst, 0, off, imm)
}
fn exit() -> Insn {
    Insn::new(class::JMP | jmp::EXIT, 0, 0, 0, 0)
}
fn call(f: i32) -> Insn {
    Insn::new(class::JMP | jmp::CALL, 0, 0, 0, f)
}

/// Prelude: leaves r6 = ctx, r8 = start (u32), r9 = start - seq0 (u32), r1 = ctx.
/// Jumps to `ret0` when the map lookup fails.
fn prelude(a: &mut Asm, map_fd: i32, ret0: usize) {
    a.emit(alu64_x(alu::MOV, 6, 1));
    a.emit(Insn::new(class::LD | mode::ABS | size::B, 0, 0, 0, SKF_NET_OFF)); // r0 = ip[0]
    a.emit(alu64_x(alu::MOV, 8, 0));
    a.emit(alu64_k(alu::AND, 8, 0x0f));
    a.emit(alu64_k(alu::LSH, 8, 2)); // r8 = IPv4 header length
    a.emit(alu64_k(alu::RSH, 0, 4));
    a.emit(Insn::new(class::JMP | jmp::JNE | src::K, 0, 0, 1, 6));
    a.emit(alu64_k(alu::MOV, 8, 40)); // IPv6: fixed header, no extensions
    a.emit(ld_ind(size::W, 8, SKF_NET_OFF + 4)); // r0 = TCP sequence number
    a.emit(alu64_x(alu::MOV, 9, 0)); // r9 = seq0
    a.emit(st(size::W, 10, -4, 0));
    a.ld_map_fd(1, map_fd);
    a.emit(alu64_x(alu::MOV, 2, 10));
    a.emit(alu64_k(alu::ADD, 2, -4));
    a.emit(call(FN_MAP_LOOKUP));
    a.jump(jmp_k(jmp::JEQ, 0, 0), ret0);
    a.emit(alu64_x(alu::MOV, 8, 9)); // start = seq0
    a.emit(ldx(size::W, 1, 0, 4)); // valid
    a.emit(Insn::new(class::JMP | jmp::JEQ | src::K, 1, 0, 1, 0));
    a.emit(ldx(size::W, 8, 0, 0)); // start = next
    a.emit(Insn::new(class::ALU | alu::MOV | src::X, 1, 8, 0, 0));
    a.emit(alu32_x(alu::SUB, 1, 9));
    a.emit(alu64_x(alu::MOV, 9, 1)); // r9 = start - seq0
    a.emit(alu64_x(alu::MOV, 1, 6)); // the body starts with r1 = ctx, as a program does
}

/// Epilogue at `epi`: r0 is the body's answer; a positive length advances the
/// state. A length above `max` (when given) becomes [`TOO_BIG`], which the
/// kernel refuses with EMSGSIZE and counts in RX-TooBig, as it does a length
/// above the TCP socket's receive buffer.
fn epilogue(a: &mut Asm, map_fd: i32, epi: usize, ret0: usize, max: Option<u32>) {
    let out = a.label();
    a.bind(epi);
    // The kernel reads the answer as an int: compare as 32-bit signed.
    a.jump(Insn::new(class::JMP32 | jmp::JSLE | src::K, 0, 0, 0, 0), out);
    if let Some(max) = max.filter(|&m| m < TOO_BIG as u32) {
        // r0 is positive here: an unsigned 32-bit compare is the signed one.
        a.emit(Insn::new(class::JMP32 | jmp::JLE | src::K, 0, 0, 1, max as i32));
        a.emit(alu64_k(alu::MOV, 0, TOO_BIG));
    }
    a.emit(alu64_x(alu::MOV, 9, 0)); // r9 = length
    a.emit(st(size::W, 10, -4, 0));
    a.ld_map_fd(1, map_fd);
    a.emit(alu64_x(alu::MOV, 2, 10));
    a.emit(alu64_k(alu::ADD, 2, -4));
    a.emit(call(FN_MAP_LOOKUP));
    let restore = a.label();
    a.jump(jmp_k(jmp::JEQ, 0, 0), restore);
    a.emit(Insn::new(class::ALU | alu::MOV | src::X, 1, 8, 0, 0));
    a.emit(alu32_x(alu::ADD, 1, 9));
    a.emit(stx(size::W, 0, 1, 0)); // next = start + length
    a.emit(st(size::W, 0, 4, 1)); // valid = 1
    a.bind(restore);
    a.emit(alu64_x(alu::MOV, 0, 9));
    a.bind(out);
    a.emit(exit());
    a.bind(ret0);
    a.emit(alu64_k(alu::MOV, 0, 0));
    a.emit(exit());
}

/// The offset-correct program for a length-field spec.
pub fn field_program(f: &FieldSpec, map_fd: i32) -> Vec<Insn> {
    field_program_limited(f, map_fd, None)
}

/// [`field_program`] refusing (EMSGSIZE) a message longer than `max` bytes.
pub fn field_program_limited(f: &FieldSpec, map_fd: i32, max: Option<u32>) -> Vec<Insn> {
    let mut a = Asm::new();
    let ret0 = a.label();
    let epi = a.label();
    let too_big = a.label();
    let bad_len = a.label();
    prelude(&mut a, map_fd, ret0);
    let off = f.offset as i32;
    match (f.width, f.little_endian) {
        (1, _) => a.emit(ld_ind(size::B, 9, off)),
        (2, false) => a.emit(ld_ind(size::H, 9, off)),
        (4, false) => a.emit(ld_ind(size::W, 9, off)),
        (w @ (2 | 4), true) => {
            a.emit(ld_ind(if w == 2 { size::H } else { size::W }, 9, off));
            // LD_IND gives the big-endian reading; swap it (BPF_TO_BE on a
            // little-endian host is a byte swap, zero-extended).
            a.emit(Insn::new(class::ALU | alu::END | src::X, 0, 0, 0, (w * 8) as i32));
        }
        (w, le) => {
            // Byte by byte into a stack slot (LD_IND clobbers r1-r5).
            a.emit(st(size::DW, 10, -16, 0));
            for k in 0..w {
                a.emit(ld_ind(size::B, 9, off + k as i32));
                a.emit(ldx(size::DW, 1, 10, -16));
                if le {
                    a.emit(alu64_k(alu::LSH, 0, 8 * k as i32));
                } else {
                    a.emit(alu64_k(alu::LSH, 1, 8));
                }
                a.emit(alu64_x(alu::OR, 1, 0));
                a.emit(stx(size::DW, 10, 1, -16));
            }
            a.emit(ldx(size::DW, 0, 10, -16));
        }
    }
    if f.signed {
        // A negative 32-bit size.
        a.jump(Insn::new(class::JMP | jmp::JSET | src::K, 0, 0, 0, i32::MIN), bad_len);
    }
    // Values beyond 2^40 are too big whatever the adjustment.
    a.ld_imm64(1, 1 << 40);
    a.jump(Insn::new(class::JMP | jmp::JGT | src::X, 0, 1, 0, 0), too_big);
    let base = if f.includes_header { 0 } else { f.header() as i64 };
    let add = base.saturating_add(f.adjust);
    if add != 0 {
        if let Ok(k) = i32::try_from(add) {
            a.emit(alu64_k(alu::ADD, 0, k));
        } else {
            a.ld_imm64(1, add);
            a.emit(alu64_x(alu::ADD, 0, 1));
        }
    }
    let min = f.min_len.max(f.header()).max(1) as i32;
    a.jump(jmp_k(jmp::JSLT, 0, min), bad_len);
    a.ld_imm64(1, TOO_BIG as i64);
    a.jump(Insn::new(class::JMP | jmp::JSGT | src::X, 0, 1, 0, 0), too_big);
    a.jump(Insn::new(class::JMP | jmp::JA, 0, 0, 0, 0), epi);
    a.bind(too_big);
    a.emit(alu64_k(alu::MOV, 0, TOO_BIG));
    a.jump(Insn::new(class::JMP | jmp::JA, 0, 0, 0, 0), epi);
    a.bind(bad_len);
    a.emit(alu64_k(alu::MOV, 0, -EPROTO));
    a.jump(Insn::new(class::JMP | jmp::JA, 0, 0, 0, 0), epi);
    epilogue(&mut a, map_fd, epi, ret0, max);
    a.finish()
}

/// Rewrite a user's program so that it reads from the message start.
///
/// Accepted: programs that read the message only with `LD_ABS`, `LD_IND` and
/// `bpf_skb_load_bytes`, do not use r8 or r9 (the rewrite keeps the message
/// offset and start there), do not read `skb->len` (under KCM it counts the
/// bytes before the message too) and make no BPF-to-BPF calls. Anything else
/// is refused with [`KernelError::NotOffsetSafe`]: such a program would
/// mis-frame messages that share a TCP segment.
pub fn rewrite_program(user: &[Insn], map_fd: i32) -> Result<Vec<Insn>, KernelError> {
    rewrite_program_limited(user, map_fd, None)
}

/// [`rewrite_program`] refusing (EMSGSIZE) a message longer than `max` bytes.
pub fn rewrite_program_limited(user: &[Insn], map_fd: i32, max: Option<u32>) -> Result<Vec<Insn>, KernelError> {
    let refuse = |at: usize, why: &str| KernelError::NotOffsetSafe(format!("instruction {at}: {why}"));
    // Check first.
    let mut i = 0;
    while i < user.len() {
        let ins = user[i];
        let cls = ins.code & 0x07;
        let wide = cls == class::LD && ins.code & 0xe0 == mode::IMM && ins.code & 0x18 == size::DW;
        let is_call = cls == class::JMP && ins.code & 0xf0 == jmp::CALL;
        if (ins.dst == 8 || ins.dst == 9) || (!wide && !is_call && (ins.src == 8 || ins.src == 9)) {
            return Err(refuse(i, "uses r8 or r9, which the offset rewrite needs"));
        }
        if is_call && (ins.src != 0 || ins.imm != FN_SKB_LOAD_BYTES) {
            return Err(refuse(i, "a call other than bpf_skb_load_bytes"));
        }
        if cls == class::LDX && ins.src != 10 && (0..4).contains(&ins.off) {
            return Err(refuse(i, "may read skb->len, which under KCM counts the bytes before the message"));
        }
        if wide && ins.src != 0 {
            return Err(refuse(i, "map or pseudo reference"));
        }
        i += if wide { 2 } else { 1 };
    }
    // Then rewrite, keeping a map from old index to new index for jumps.
    let mut a = Asm::new();
    let ret0 = a.label();
    let epi = a.label();
    prelude(&mut a, map_fd, ret0);
    let base = a.insns.len();
    let mut new_at = vec![0usize; user.len() + 1];
    let mut out: Vec<Insn> = Vec::new();
    let mut jumps: Vec<(usize, usize)> = Vec::new(); // (out index, old target)
    let mut exits: Vec<usize> = Vec::new();
    let mut i = 0;
    while i < user.len() {
        new_at[i] = out.len();
        let ins = user[i];
        let cls = ins.code & 0x07;
        let wide = cls == class::LD && ins.code & 0xe0 == mode::IMM && ins.code & 0x18 == size::DW;
        if wide {
            out.push(ins);
            out.push(user[i + 1]);
            new_at[i + 1] = out.len() - 1;
            i += 2;
            continue;
        }
        match cls {
            class::LD if ins.code & 0xe0 == mode::ABS => {
                out.push(Insn::new(class::LD | mode::IND | (ins.code & 0x18), 0, 9, 0, ins.imm));
            }
            class::LD if ins.code & 0xe0 == mode::IND => {
                // r5 = src + off (LD_IND clobbers r1-r5 anyway).
                out.push(Insn::new(class::ALU | alu::MOV | src::X, 5, ins.src, 0, 0));
                out.push(alu32_x(alu::ADD, 5, 9));
                out.push(Insn::new(ins.code, 0, 5, 0, ins.imm));
            }
            class::JMP | class::JMP32 => {
                let op = ins.code & 0xf0;
                if cls == class::JMP && op == jmp::EXIT {
                    exits.push(out.len());
                    out.push(Insn::new(class::JMP | jmp::JA, 0, 0, 0, 0));
                } else if cls == class::JMP && op == jmp::CALL {
                    if ins.imm == FN_SKB_LOAD_BYTES {
                        out.push(alu32_x(alu::ADD, 2, 9));
                    }
                    out.push(ins);
                } else {
                    let target = (i as i64 + 1 + ins.off as i64) as usize;
                    jumps.push((out.len(), target));
                    out.push(ins);
                }
            }
            _ => out.push(ins),
        }
        i += 1;
    }
    new_at[user.len()] = out.len();
    for (at, target) in jumps {
        let t = *new_at.get(target).ok_or_else(|| refuse(target, "jump out of the program"))?;
        let ins = out[at];
        out[at] = Insn::new(ins.code, ins.dst, ins.src, (t as i64 - at as i64 - 1) as i16, ins.imm);
    }
    let epi_at = base + out.len();
    for at in exits {
        let ins = out[at];
        out[at] = Insn::new(ins.code, 0, 0, (epi_at as i64 - (base + at) as i64 - 1) as i16, 0);
    }
    for ins in out {
        a.emit(ins);
    }
    epilogue(&mut a, map_fd, epi, ret0, max);
    Ok(a.finish())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_map_to_fields() {
        let f = FieldSpec::from_spec("l4").unwrap();
        assert_eq!((f.offset, f.width, f.little_endian, f.includes_header), (0, 4, false, false));
        let f = FieldSpec::from_spec("len:offset=2,width=3,endian=le,adjust=-1,includes_header=true").unwrap();
        assert_eq!(
            (f.offset, f.width, f.little_endian, f.adjust, f.includes_header, f.min_len),
            (2, 3, true, -1, true, 5)
        );
        assert!(FieldSpec::from_spec("9p").unwrap().little_endian);
        assert!(matches!(FieldSpec::from_spec("oncrpc"), Err(KernelError::UnsupportedParser(_))));
        assert!(matches!(FieldSpec::from_spec("http2"), Err(KernelError::UnsupportedParser(_))));
        assert!(matches!(FieldSpec::from_spec("nope"), Err(KernelError::Spec(_))));
    }

    #[test]
    fn generated_programs_have_resolved_jumps_and_end_in_exit() {
        for spec in ["l4", "9p", "thrift", "len:width=8", "len:offset=3,width=3,endian=le,adjust=-5"] {
            let p = field_program(&FieldSpec::from_spec(spec).unwrap(), 3);
            assert_eq!(p.last().unwrap().code, class::JMP | jmp::EXIT, "{spec}");
            for (i, ins) in p.iter().enumerate() {
                let c = ins.code & 0x07;
                if (c == class::JMP || c == class::JMP32)
                    && ins.code & 0xf0 != jmp::CALL
                    && ins.code & 0xf0 != jmp::EXIT
                {
                    let t = i as i64 + 1 + ins.off as i64;
                    assert!(t > i as i64 && (t as usize) < p.len(), "{spec}: jump at {i} to {t}");
                }
            }
        }
    }

    #[test]
    fn a_limit_turns_longer_lengths_into_too_big() {
        let f = FieldSpec::from_spec("l4").unwrap();
        let limited = field_program_limited(&f, 3, Some(4096));
        let cmp = Insn::new(class::JMP32 | jmp::JLE | src::K, 0, 0, 1, 4096);
        assert!(limited.contains(&cmp));
        assert_eq!(limited[limited.iter().position(|i| *i == cmp).unwrap() + 1], alu64_k(alu::MOV, 0, TOO_BIG));
        assert!(!field_program(&f, 3).contains(&cmp));
        // A limit at or above what the kernel already refuses adds nothing.
        assert_eq!(field_program_limited(&f, 3, Some(u32::MAX)), field_program(&f, 3));
    }

    #[test]
    fn rewrite_refuses_what_it_cannot_shift() {
        use connmux_bpf::asm;
        let uses_r9 = [asm::mov64_imm(9, 1), asm::mov64_imm(0, 0), asm::exit()];
        assert!(matches!(rewrite_program(&uses_r9, 3), Err(KernelError::NotOffsetSafe(_))));
        let reads_len = [asm::ldx(size::W, 0, 1, 0), asm::exit()];
        assert!(matches!(rewrite_program(&reads_len, 3), Err(KernelError::NotOffsetSafe(_))));
        // The textbook parser: ld_abs_w[0] + 4 becomes ld_ind_w[r9 + 0] + 4.
        let textbook = [asm::mov64_reg(6, 1), asm::ld_abs(size::W, 0), asm::alu64_imm(alu::ADD, 0, 4), asm::exit()];
        let p = rewrite_program(&textbook, 3).unwrap();
        assert!(p.iter().any(|i| i.code == class::LD | mode::IND | size::W && i.src == 9 && i.imm == 0));
        assert!(!p.iter().any(|i| i.code & 0xe0 == mode::ABS && i.imm == 0 && i.code & 0x07 == class::LD));
    }
}
