//! eBPF instructions as the kernel encodes them (`struct bpf_insn`, 8 bytes,
//! little-endian), with the opcode constants this crate knows.
//!
//! Layout of one instruction: `code:8 | dst:4 src:4 | off:16 | imm:32`. `LD_IMM64`
//! takes two slots; the second has code 0 and carries the upper 32 bits in `imm`.

/// Instruction classes (`code & 0x07`).
pub mod class {
    pub const LD: u8 = 0x00;
    pub const LDX: u8 = 0x01;
    pub const ST: u8 = 0x02;
    pub const STX: u8 = 0x03;
    pub const ALU: u8 = 0x04;
    pub const JMP: u8 = 0x05;
    pub const JMP32: u8 = 0x06;
    pub const ALU64: u8 = 0x07;
}

/// Operand source (`code & 0x08`) for ALU and jumps; for `END`, the byte order.
pub mod src {
    /// The immediate (or, for `END`, "to little-endian").
    pub const K: u8 = 0x00;
    /// The source register (or, for `END`, "to big-endian").
    pub const X: u8 = 0x08;
}

/// ALU operations (`code & 0xf0`).
pub mod alu {
    pub const ADD: u8 = 0x00;
    pub const SUB: u8 = 0x10;
    pub const MUL: u8 = 0x20;
    pub const DIV: u8 = 0x30;
    pub const OR: u8 = 0x40;
    pub const AND: u8 = 0x50;
    pub const LSH: u8 = 0x60;
    pub const RSH: u8 = 0x70;
    pub const NEG: u8 = 0x80;
    pub const MOD: u8 = 0x90;
    pub const XOR: u8 = 0xa0;
    pub const MOV: u8 = 0xb0;
    pub const ARSH: u8 = 0xc0;
    pub const END: u8 = 0xd0;
}

/// Jump operations (`code & 0xf0`).
pub mod jmp {
    pub const JA: u8 = 0x00;
    pub const JEQ: u8 = 0x10;
    pub const JGT: u8 = 0x20;
    pub const JGE: u8 = 0x30;
    pub const JSET: u8 = 0x40;
    pub const JNE: u8 = 0x50;
    pub const JSGT: u8 = 0x60;
    pub const JSGE: u8 = 0x70;
    pub const CALL: u8 = 0x80;
    pub const EXIT: u8 = 0x90;
    pub const JLT: u8 = 0xa0;
    pub const JLE: u8 = 0xb0;
    pub const JSLT: u8 = 0xc0;
    pub const JSLE: u8 = 0xd0;
}

/// Access sizes (`code & 0x18`).
pub mod size {
    pub const W: u8 = 0x00;
    pub const H: u8 = 0x08;
    pub const B: u8 = 0x10;
    pub const DW: u8 = 0x18;
}

/// Load/store modes (`code & 0xe0`).
pub mod mode {
    pub const IMM: u8 = 0x00;
    pub const ABS: u8 = 0x20;
    pub const IND: u8 = 0x40;
    pub const MEM: u8 = 0x60;
    /// Sign-extending load (BPF v4).
    pub const MEMSX: u8 = 0x80;
    pub const ATOMIC: u8 = 0xc0;
}

/// `imm` of an atomic instruction.
pub mod atomic {
    pub const ADD: i32 = 0x00;
    pub const OR: i32 = 0x40;
    pub const AND: i32 = 0x50;
    pub const XOR: i32 = 0xa0;
    /// Or'ed into ADD/OR/AND/XOR: the old value goes to `src`.
    pub const FETCH: i32 = 0x01;
    pub const XCHG: i32 = 0xe0 | FETCH;
    pub const CMPXCHG: i32 = 0xf0 | FETCH;
}

/// Helper function ids (the `imm` of `call`) that the interpreter provides.
pub mod helper {
    /// `long bpf_skb_load_bytes(const void *skb, u32 offset, void *to, u32 len)`.
    pub const SKB_LOAD_BYTES: i32 = 26;
}

/// `src` of a `call`: 0 is a helper; these other kinds are not provided.
pub mod pseudo {
    /// A call to another BPF function in the same program.
    pub const CALL: u8 = 1;
    /// A call to a kernel function (kfunc).
    pub const KFUNC_CALL: u8 = 2;
}

/// One raw instruction slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Insn {
    pub code: u8,
    pub dst: u8,
    pub src: u8,
    pub off: i16,
    pub imm: i32,
}

impl Insn {
    pub const fn new(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Insn {
        Insn { code, dst, src, off, imm }
    }

    /// Decode one slot from its 8 bytes (little-endian, as `clang -target bpf` and
    /// x86/arm64 kernels lay out `struct bpf_insn`).
    pub fn from_bytes(b: [u8; 8]) -> Insn {
        Insn {
            code: b[0],
            dst: b[1] & 0x0f,
            src: b[1] >> 4,
            off: i16::from_le_bytes([b[2], b[3]]),
            imm: i32::from_le_bytes([b[4], b[5], b[6], b[7]]),
        }
    }

    /// Encode to the 8 bytes the kernel's `BPF_PROG_LOAD` takes.
    pub fn to_bytes(self) -> [u8; 8] {
        let mut b = [0u8; 8];
        b[0] = self.code;
        b[1] = (self.dst & 0x0f) | (self.src << 4);
        b[2..4].copy_from_slice(&self.off.to_le_bytes());
        b[4..8].copy_from_slice(&self.imm.to_le_bytes());
        b
    }

    pub fn class(self) -> u8 {
        self.code & 0x07
    }

    /// The two slots of `dst = imm64`.
    pub fn ld_imm64(dst: u8, imm: u64) -> [Insn; 2] {
        [
            Insn::new(class::LD | size::DW | mode::IMM, dst, 0, 0, imm as u32 as i32),
            Insn::new(0, 0, 0, 0, (imm >> 32) as u32 as i32),
        ]
    }
}

/// Decode raw bytecode (a whole number of 8-byte slots).
pub fn decode(code: &[u8]) -> Result<Vec<Insn>, crate::LoadError> {
    if !code.len().is_multiple_of(8) {
        return Err(crate::LoadError::NotWholeInstructions { len: code.len() });
    }
    Ok(code.chunks_exact(8).map(|c| Insn::from_bytes(c.try_into().expect("chunks of 8"))).collect())
}

/// Encode instructions to the byte slots `BPF_PROG_LOAD` takes.
pub fn encode(insns: &[Insn]) -> Vec<[u8; 8]> {
    insns.iter().map(|i| i.to_bytes()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let i = Insn::new(0x61, 3, 10, -8, -123456);
        let b = i.to_bytes();
        assert_eq!(b, [0x61, 0xa3, 0xf8, 0xff, 0xc0, 0x1d, 0xfe, 0xff]);
        assert_eq!(Insn::from_bytes(b), i);
    }

    #[test]
    fn decode_refuses_partial_slots() {
        assert!(matches!(decode(&[0u8; 12]), Err(crate::LoadError::NotWholeInstructions { len: 12 })));
        assert_eq!(decode(&[0x95, 0, 0, 0, 0, 0, 0, 0]).unwrap().len(), 1);
    }
}
