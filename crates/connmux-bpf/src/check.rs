//! The load-time checker: every instruction known and well formed, registers in
//! range, jumps inside the program, fixed stack accesses inside the 512-byte stack,
//! only the helpers the interpreter provides, no register read before it is
//! written, nothing unreachable and no path running off the end.
//!
//! It is much smaller than the kernel's verifier: it does not track pointer types
//! or value ranges, so it cannot prove that a loop ends or that a computed address
//! is valid. Those are checked while the program runs instead (the instruction
//! budget, and a bounds check on every memory access), and end the run with a
//! [`Fault`](crate::Fault).

use crate::insn::{alu, atomic, class, helper, jmp, mode, pseudo, size, src, Insn};

/// Size of the program stack, as in the kernel (`MAX_BPF_STACK`).
pub const STACK_SIZE: usize = 512;

/// The frame pointer register (read-only).
const FP: u8 = 10;

/// Limits applied when a program is loaded and run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Most instruction slots a program may have. Default 65,536: parser programs
    /// are tens to hundreds of instructions; the bound keeps the checker's work
    /// and the program's memory small.
    pub max_insns: usize,
    /// Most instructions one run may execute before it is stopped with
    /// [`Fault::Budget`](crate::Fault::Budget). Default 1,048,576: the kernel's
    /// verifier stops exploring after about a million instructions
    /// (`BPF_COMPLEXITY_LIMIT_INSNS`), so a program it accepts needs no more;
    /// a run that long costs a few milliseconds at most.
    pub budget: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { max_insns: 1 << 16, budget: 1 << 20 }
    }
}

/// Why a program was refused at load. `pc` is the instruction slot's index.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CheckError {
    #[error("the program has no instructions")]
    Empty,
    #[error("the program has {len} instructions, more than the limit of {max}")]
    TooLong { len: usize, max: usize },
    #[error("instruction {pc}: unknown opcode {code:#04x}")]
    UnknownOpcode { pc: usize, code: u8 },
    #[error("instruction {pc}: field that must be zero or is out of its range ({code:#04x})")]
    ReservedField { pc: usize, code: u8 },
    #[error("instruction {pc}: no register r{reg}")]
    BadRegister { pc: usize, reg: u8 },
    #[error("instruction {pc}: writes r10, the read-only frame pointer")]
    FramePointerWrite { pc: usize },
    #[error("instruction {pc}: reads r{reg} before anything is written to it")]
    UninitializedRegister { pc: usize, reg: u8 },
    #[error("instruction {pc}: jump to {target}, outside the program of {len} instructions")]
    JumpOutOfRange { pc: usize, target: i64, len: usize },
    #[error("instruction {pc}: jump into the middle of the 64-bit load at {target}")]
    JumpIntoLdImm64 { pc: usize, target: usize },
    #[error("instruction {pc}: 64-bit immediate load without its second half")]
    IncompleteLdImm64 { pc: usize },
    #[error("instruction {pc}: 64-bit load of kind {kind} (maps, BTF ids, functions) not provided")]
    UnsupportedLdImm64 { pc: usize, kind: u8 },
    #[error("instruction {pc}: execution can run past the last instruction")]
    FallsOffEnd { pc: usize },
    #[error("instruction {pc} can never be reached")]
    Unreachable { pc: usize },
    #[error("instruction {pc}: stack access at r10{off:+} of {size} bytes is outside the 512-byte stack")]
    StackOutOfBounds { pc: usize, off: i16, size: usize },
    #[error("instruction {pc}: stack access at r10{off:+} of {size} bytes is not aligned")]
    MisalignedStack { pc: usize, off: i16, size: usize },
    #[error("instruction {pc}: call to helper {id}, which is not provided (only bpf_skb_load_bytes, 26)")]
    UnknownHelper { pc: usize, id: i32 },
    #[error("instruction {pc}: {what} calls are not supported")]
    UnsupportedCall { pc: usize, what: &'static str },
    #[error("instruction {pc}: division or modulo by the constant 0")]
    DivisionByZero { pc: usize },
    #[error("instruction {pc}: shift by {amount}, out of range for the operand width")]
    BadShift { pc: usize, amount: i32 },
    #[error("instruction {pc}: byte swap of width {width} (16, 32 or 64 only)")]
    BadByteSwap { pc: usize, width: i32 },
    #[error("instruction {pc}: atomic operation {op:#x} not known")]
    BadAtomic { pc: usize, op: i32 },
}

/// One checked instruction, ready for the interpreter. `imm` is sign-extended (or
/// the whole 64-bit value for `LD_IMM64`) so the hot loop does no decoding.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Op {
    pub code: u8,
    pub dst: u8,
    pub src: u8,
    pub off: i16,
    pub imm: i64,
}

pub(crate) struct Checked {
    pub ops: Box<[Op]>,
    /// Bytes at the top of the stack the program can touch: cleared before each run.
    pub stack_depth: usize,
}

/// How one instruction uses registers and where control goes next.
#[derive(Default)]
struct Effects {
    reads: u16,
    writes: u16,
    /// Left unreadable afterwards (r1–r5 after a call or `LD_ABS`/`LD_IND`).
    clobbers: u16,
    /// Goes on to the next instruction (or the one after an `LD_IMM64`).
    falls_through: bool,
    jump: Option<usize>,
}

const fn bit(r: u8) -> u16 {
    1 << r
}
const CALLER_SAVED: u16 = 0b11_1110; // r1..r5

fn bytes_of(sz: u8) -> usize {
    match sz {
        size::B => 1,
        size::H => 2,
        size::W => 4,
        _ => 8,
    }
}

pub(crate) fn check(insns: &[Insn], limits: &Limits) -> Result<Checked, CheckError> {
    let len = insns.len();
    if len == 0 {
        return Err(CheckError::Empty);
    }
    if len > limits.max_insns {
        return Err(CheckError::TooLong { len, max: limits.max_insns });
    }

    let mut ops = Vec::with_capacity(len);
    let mut effects = Vec::with_capacity(len);
    // Second halves of LD_IMM64: not instructions, not jump targets.
    let mut second_half = vec![false; len];
    let mut stack_depth = 0usize;
    let mut fp_escapes = false;

    let mut pc = 0;
    while pc < len {
        let insn = insns[pc];
        let (op, eff) = check_one(pc, insn, insns.get(pc + 1).copied(), &mut stack_depth)?;
        if uses_fp_as_value(insn) {
            fp_escapes = true;
        }
        ops.push(op);
        effects.push(eff);
        if insn.code == class::LD | size::DW | mode::IMM {
            second_half[pc + 1] = true;
            // The second slot is never executed; keep indices equal to slots.
            ops.push(Op { code: 0, dst: 0, src: 0, off: 0, imm: 0 });
            effects.push(Effects::default());
            pc += 2;
        } else {
            pc += 1;
        }
    }

    // Jump targets: inside the program and not onto a second half.
    for (pc, insn) in insns.iter().enumerate() {
        if second_half[pc] {
            continue;
        }
        if let Some(delta) = jump_offset(*insn) {
            let target = pc as i64 + 1 + delta;
            if target < 0 || target >= len as i64 {
                return Err(CheckError::JumpOutOfRange { pc, target, len });
            }
            if second_half[target as usize] {
                return Err(CheckError::JumpIntoLdImm64 { pc, target: target as usize });
            }
            effects[pc].jump = Some(target as usize);
        }
    }

    flow(&effects, &second_half)?;

    Ok(Checked {
        ops: ops.into_boxed_slice(),
        // A pointer into the stack that leaves r10 can reach any of it.
        stack_depth: if fp_escapes { STACK_SIZE } else { stack_depth.next_multiple_of(8) },
    })
}

/// Does `insn` use r10 as a value rather than as the base of a fixed stack access?
fn uses_fp_as_value(insn: Insn) -> bool {
    let cls = insn.class();
    let x = insn.code & src::X == src::X;
    match cls {
        class::ALU | class::ALU64 => (x && insn.src == FP) || insn.dst == FP,
        class::JMP | class::JMP32 => {
            let op = insn.code & 0xf0;
            op != jmp::CALL && op != jmp::EXIT && op != jmp::JA && (insn.dst == FP || (x && insn.src == FP))
        }
        class::STX => insn.src == FP,
        class::LD => insn.code & 0xe0 == mode::IND && insn.src == FP,
        _ => false,
    }
}

fn jump_offset(insn: Insn) -> Option<i64> {
    match insn.class() {
        class::JMP => match insn.code & 0xf0 {
            jmp::CALL | jmp::EXIT => None,
            _ => Some(insn.off as i64),
        },
        // JMP32 | JA ("gotol") takes its offset from imm.
        class::JMP32 if insn.code & 0xf0 == jmp::JA => Some(insn.imm as i64),
        class::JMP32 => Some(insn.off as i64),
        _ => None,
    }
}

fn reg(pc: usize, r: u8) -> Result<u8, CheckError> {
    if r > FP {
        Err(CheckError::BadRegister { pc, reg: r })
    } else {
        Ok(r)
    }
}

/// A register the instruction writes: r0–r9.
fn wreg(pc: usize, r: u8) -> Result<u8, CheckError> {
    match reg(pc, r)? {
        FP => Err(CheckError::FramePointerWrite { pc }),
        r => Ok(r),
    }
}

fn stack_access(pc: usize, base: u8, off: i16, n: usize, depth: &mut usize) -> Result<(), CheckError> {
    if base != FP {
        return Ok(()); // checked at run time
    }
    let o = off as i64;
    if o < -(STACK_SIZE as i64) || o + n as i64 > 0 {
        return Err(CheckError::StackOutOfBounds { pc, off, size: n });
    }
    // The kernel requires aligned stack accesses whatever the architecture.
    if o % n as i64 != 0 {
        return Err(CheckError::MisalignedStack { pc, off, size: n });
    }
    *depth = (*depth).max((-o) as usize);
    Ok(())
}

fn check_one(pc: usize, insn: Insn, next: Option<Insn>, depth: &mut usize) -> Result<(Op, Effects), CheckError> {
    let Insn { code, dst, src: s, off, imm } = insn;
    let reserved = || CheckError::ReservedField { pc, code };
    let unknown = || CheckError::UnknownOpcode { pc, code };
    let op = |imm: i64| Op { code, dst, src: s, off, imm };
    let mut e = Effects { falls_through: true, ..Default::default() };

    match insn.class() {
        class::ALU | class::ALU64 => {
            let is64 = insn.class() == class::ALU64;
            let x = code & src::X == src::X;
            let o = code & 0xf0;
            let d = wreg(pc, dst)?;
            e.writes = bit(d);
            match o {
                alu::ADD
                | alu::SUB
                | alu::MUL
                | alu::OR
                | alu::AND
                | alu::XOR
                | alu::LSH
                | alu::RSH
                | alu::ARSH
                | alu::DIV
                | alu::MOD => {
                    // DIV/MOD take off = 1 for the signed form (BPF v4).
                    let signed_ok = matches!(o, alu::DIV | alu::MOD);
                    if off != 0 && !(signed_ok && off == 1) {
                        return Err(reserved());
                    }
                    e.reads = bit(d);
                    if x {
                        if imm != 0 {
                            return Err(reserved());
                        }
                        e.reads |= bit(reg(pc, s)?);
                    } else {
                        if s != 0 {
                            return Err(reserved());
                        }
                        if matches!(o, alu::DIV | alu::MOD) && imm == 0 {
                            return Err(CheckError::DivisionByZero { pc });
                        }
                        if matches!(o, alu::LSH | alu::RSH | alu::ARSH) {
                            let width = if is64 { 64 } else { 32 };
                            if !(0..width).contains(&imm) {
                                return Err(CheckError::BadShift { pc, amount: imm });
                            }
                        }
                    }
                }
                alu::NEG => {
                    if x || s != 0 || off != 0 || imm != 0 {
                        return Err(reserved());
                    }
                    e.reads = bit(d);
                }
                alu::MOV => {
                    if x {
                        // off = 8/16/32 is the sign-extending move (BPF v4).
                        let ok = matches!(off, 0 | 8 | 16) || (is64 && off == 32);
                        if imm != 0 || !ok {
                            return Err(reserved());
                        }
                        e.reads = bit(reg(pc, s)?);
                    } else if s != 0 || off != 0 {
                        return Err(reserved());
                    }
                }
                alu::END => {
                    // ALU64 | END is the unconditional byte swap (BPF v4); only
                    // its "K" form exists.
                    if s != 0 || off != 0 || (is64 && x) {
                        return Err(reserved());
                    }
                    if !matches!(imm, 16 | 32 | 64) {
                        return Err(CheckError::BadByteSwap { pc, width: imm });
                    }
                    e.reads = bit(d);
                }
                _ => return Err(unknown()),
            }
            Ok((op(imm as i64), e))
        }

        class::JMP | class::JMP32 => {
            let is32 = insn.class() == class::JMP32;
            let x = code & src::X == src::X;
            match code & 0xf0 {
                jmp::JA => {
                    // JMP | JA takes off; JMP32 | JA ("gotol") takes imm.
                    let bad = if is32 { off != 0 } else { imm != 0 };
                    if x || dst != 0 || s != 0 || bad {
                        return Err(reserved());
                    }
                    e.falls_through = false;
                }
                jmp::CALL if !is32 => {
                    if x || dst != 0 || off != 0 {
                        return Err(reserved());
                    }
                    match s {
                        0 => {}
                        pseudo::CALL => return Err(CheckError::UnsupportedCall { pc, what: "BPF-to-BPF function" }),
                        pseudo::KFUNC_CALL => {
                            return Err(CheckError::UnsupportedCall { pc, what: "kernel function (kfunc)" })
                        }
                        _ => return Err(reserved()),
                    }
                    if imm != helper::SKB_LOAD_BYTES {
                        return Err(CheckError::UnknownHelper { pc, id: imm });
                    }
                    e.reads = bit(1) | bit(2) | bit(3) | bit(4);
                    e.clobbers = CALLER_SAVED;
                    e.writes = bit(0);
                }
                jmp::EXIT if !is32 => {
                    if x || dst != 0 || s != 0 || off != 0 || imm != 0 {
                        return Err(reserved());
                    }
                    e.reads = bit(0);
                    e.falls_through = false;
                }
                jmp::JEQ
                | jmp::JGT
                | jmp::JGE
                | jmp::JSET
                | jmp::JNE
                | jmp::JSGT
                | jmp::JSGE
                | jmp::JLT
                | jmp::JLE
                | jmp::JSLT
                | jmp::JSLE => {
                    e.reads = bit(reg(pc, dst)?);
                    if x {
                        if imm != 0 {
                            return Err(reserved());
                        }
                        e.reads |= bit(reg(pc, s)?);
                    } else if s != 0 {
                        return Err(reserved());
                    }
                }
                _ => return Err(unknown()),
            }
            Ok((op(imm as i64), e))
        }

        class::LD => {
            let sz = code & 0x18;
            match code & 0xe0 {
                mode::IMM if sz == size::DW => {
                    let Some(hi) = next else {
                        return Err(CheckError::IncompleteLdImm64 { pc });
                    };
                    if hi.code != 0 || hi.dst != 0 || hi.src != 0 || hi.off != 0 {
                        return Err(CheckError::IncompleteLdImm64 { pc });
                    }
                    if s != 0 {
                        return Err(CheckError::UnsupportedLdImm64 { pc, kind: s });
                    }
                    if off != 0 {
                        return Err(reserved());
                    }
                    let d = wreg(pc, dst)?;
                    e.writes = bit(d);
                    let v = (imm as u32 as u64) | ((hi.imm as u32 as u64) << 32);
                    Ok((op(v as i64), e))
                }
                m @ (mode::ABS | mode::IND) if sz != size::DW => {
                    if dst != 0 || off != 0 || (m == mode::ABS && s != 0) {
                        return Err(reserved());
                    }
                    // The kernel wants the context in r6 here; we only need it
                    // written (the message is implicit).
                    e.reads = bit(6);
                    if m == mode::IND {
                        e.reads |= bit(reg(pc, s)?);
                    }
                    e.clobbers = CALLER_SAVED;
                    e.writes = bit(0);
                    Ok((op(imm as i64), e))
                }
                _ => Err(unknown()),
            }
        }

        class::LDX => {
            let sz = code & 0x18;
            match code & 0xe0 {
                mode::MEM => {}
                mode::MEMSX if sz != size::DW => {}
                _ => return Err(unknown()),
            }
            if imm != 0 {
                return Err(reserved());
            }
            let d = wreg(pc, dst)?;
            let b = reg(pc, s)?;
            stack_access(pc, b, off, bytes_of(sz), depth)?;
            e.reads = bit(b);
            e.writes = bit(d);
            Ok((op(0), e))
        }

        class::ST => {
            if code & 0xe0 != mode::MEM {
                return Err(unknown());
            }
            if s != 0 {
                return Err(reserved());
            }
            let b = reg(pc, dst)?;
            stack_access(pc, b, off, bytes_of(code & 0x18), depth)?;
            e.reads = bit(b);
            Ok((op(imm as i64), e))
        }

        class::STX => {
            let sz = code & 0x18;
            let b = reg(pc, dst)?;
            let v = reg(pc, s)?;
            e.reads = bit(b) | bit(v);
            match code & 0xe0 {
                mode::MEM => {
                    if imm != 0 {
                        return Err(reserved());
                    }
                }
                mode::ATOMIC if sz == size::W || sz == size::DW => match imm {
                    atomic::ADD | atomic::OR | atomic::AND | atomic::XOR => {}
                    _ if imm == atomic::ADD | atomic::FETCH
                        || imm == atomic::OR | atomic::FETCH
                        || imm == atomic::AND | atomic::FETCH
                        || imm == atomic::XOR | atomic::FETCH
                        || imm == atomic::XCHG =>
                    {
                        e.writes = bit(wreg(pc, v)?);
                    }
                    atomic::CMPXCHG => {
                        e.reads |= bit(0);
                        e.writes = bit(0);
                    }
                    _ => return Err(CheckError::BadAtomic { pc, op: imm }),
                },
                _ => return Err(unknown()),
            }
            stack_access(pc, b, off, bytes_of(sz), depth)?;
            Ok((op(imm as i64), e))
        }

        _ => Err(unknown()),
    }
}

/// Walk every path: registers written before read, nothing unreachable, no path
/// off the end. The state per instruction is the set of registers written on
/// every path to it, so each instruction is revisited at most once per register
/// lost: the walk is bounded by 12 × the program length.
fn flow(effects: &[Effects], second_half: &[bool]) -> Result<(), CheckError> {
    let len = effects.len();
    let mut state: Vec<Option<u16>> = vec![None; len];
    let mut work = vec![0usize];
    state[0] = Some(bit(1) | bit(FP));
    while let Some(pc) = work.pop() {
        let live = state[pc].expect("queued instructions have a state");
        let e = &effects[pc];
        let missing = e.reads & !live;
        if missing != 0 {
            return Err(CheckError::UninitializedRegister { pc, reg: missing.trailing_zeros() as u8 });
        }
        let out = (live & !e.clobbers) | e.writes;
        let next = if pc + 1 < len && second_half[pc + 1] { pc + 2 } else { pc + 1 };
        let succ = [e.falls_through.then_some(next), e.jump];
        for t in succ.into_iter().flatten() {
            if t >= len {
                return Err(CheckError::FallsOffEnd { pc });
            }
            let merged = match state[t] {
                None => out,
                Some(old) => old & out,
            };
            if state[t] != Some(merged) {
                state[t] = Some(merged);
                work.push(t);
            }
        }
    }
    for pc in 0..len {
        if state[pc].is_none() && !second_half[pc] {
            return Err(CheckError::Unreachable { pc });
        }
    }
    Ok(())
}
