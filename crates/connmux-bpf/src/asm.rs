//! Builders for single instructions, for writing small programs by hand (tests,
//! tools). Names follow the kernel's `BPF_*` macros in `include/linux/filter.h`.

use crate::insn::{alu, class, jmp, mode, size, src, Insn};

/// `dst op= imm` (64-bit).
pub const fn alu64_imm(op: u8, dst: u8, imm: i32) -> Insn {
    Insn::new(class::ALU64 | op | src::K, dst, 0, 0, imm)
}
/// `dst op= src` (64-bit).
pub const fn alu64_reg(op: u8, dst: u8, s: u8) -> Insn {
    Insn::new(class::ALU64 | op | src::X, dst, s, 0, 0)
}
/// `dst op= imm` (32-bit).
pub const fn alu32_imm(op: u8, dst: u8, imm: i32) -> Insn {
    Insn::new(class::ALU | op | src::K, dst, 0, 0, imm)
}
/// `dst op= src` (32-bit).
pub const fn alu32_reg(op: u8, dst: u8, s: u8) -> Insn {
    Insn::new(class::ALU | op | src::X, dst, s, 0, 0)
}
pub const fn mov64_imm(dst: u8, imm: i32) -> Insn {
    alu64_imm(alu::MOV, dst, imm)
}
pub const fn mov64_reg(dst: u8, s: u8) -> Insn {
    alu64_reg(alu::MOV, dst, s)
}
/// `if dst op imm goto pc + 1 + off` (64-bit compare).
pub const fn jmp_imm(op: u8, dst: u8, imm: i32, off: i16) -> Insn {
    Insn::new(class::JMP | op | src::K, dst, 0, off, imm)
}
/// `if dst op src goto pc + 1 + off` (64-bit compare).
pub const fn jmp_reg(op: u8, dst: u8, s: u8, off: i16) -> Insn {
    Insn::new(class::JMP | op | src::X, dst, s, off, 0)
}
/// `if (u32)dst op imm goto pc + 1 + off`.
pub const fn jmp32_imm(op: u8, dst: u8, imm: i32, off: i16) -> Insn {
    Insn::new(class::JMP32 | op | src::K, dst, 0, off, imm)
}
/// `if (u32)dst op (u32)src goto pc + 1 + off`.
pub const fn jmp32_reg(op: u8, dst: u8, s: u8, off: i16) -> Insn {
    Insn::new(class::JMP32 | op | src::X, dst, s, off, 0)
}
pub const fn ja(off: i16) -> Insn {
    Insn::new(class::JMP | jmp::JA, 0, 0, off, 0)
}
pub const fn call(helper: i32) -> Insn {
    Insn::new(class::JMP | jmp::CALL, 0, 0, 0, helper)
}
pub const fn exit() -> Insn {
    Insn::new(class::JMP | jmp::EXIT, 0, 0, 0, 0)
}
/// `r0 = ntoh(*(sz *)(data + imm))`; `sz` is [`size::B`], [`size::H`] or [`size::W`].
pub const fn ld_abs(sz: u8, imm: i32) -> Insn {
    Insn::new(class::LD | mode::ABS | sz, 0, 0, 0, imm)
}
/// `r0 = ntoh(*(sz *)(data + src + imm))`.
pub const fn ld_ind(sz: u8, s: u8, imm: i32) -> Insn {
    Insn::new(class::LD | mode::IND | sz, 0, s, 0, imm)
}
/// `dst = *(sz *)(src + off)`.
pub const fn ldx(sz: u8, dst: u8, s: u8, off: i16) -> Insn {
    Insn::new(class::LDX | mode::MEM | sz, dst, s, off, 0)
}
/// `*(sz *)(dst + off) = imm`.
pub const fn st(sz: u8, dst: u8, off: i16, imm: i32) -> Insn {
    Insn::new(class::ST | mode::MEM | sz, dst, 0, off, imm)
}
/// `*(sz *)(dst + off) = src`.
pub const fn stx(sz: u8, dst: u8, s: u8, off: i16) -> Insn {
    Insn::new(class::STX | mode::MEM | sz, dst, s, off, 0)
}
/// `BPF_END` byte swaps: `to_be` false is "to little-endian" (a truncation here).
pub const fn endian(to_be: bool, dst: u8, width: i32) -> Insn {
    Insn::new(class::ALU | alu::END | if to_be { src::X } else { src::K }, dst, 0, 0, width)
}
/// BPF v4 unconditional byte swap.
pub const fn bswap(dst: u8, width: i32) -> Insn {
    Insn::new(class::ALU64 | alu::END, dst, 0, 0, width)
}
/// Shorthands for the size field.
pub use size::{B, DW, H, W};
