//! The load-time checker refuses each kind of bad program with its own error,
//! and the run-time checks stop what it cannot see. No kernel needed.

use connmux_bpf::asm::*;
use connmux_bpf::insn::{alu, atomic, class, jmp, mode, pseudo, src};
use connmux_bpf::{parse_result, BpfParser, CheckError, Fault, Insn, Limits, LoadError, Program, Vm};
use connmux_core::{Parse, ParseError, Parser};

fn refuse(insns: &[Insn]) -> CheckError {
    Program::new(insns).expect_err("the checker should refuse this program")
}

fn run(insns: &[Insn], data: &[u8]) -> Result<u64, Fault> {
    Program::new(insns).expect("program accepted").run(&mut Vm::new(), data)
}

const RET0: [Insn; 2] = [mov64_imm(0, 0), exit()];

fn with_ret0(head: &[Insn]) -> Vec<Insn> {
    let mut v = head.to_vec();
    v.extend_from_slice(&RET0);
    v
}

#[test]
fn structure() {
    assert_eq!(refuse(&[]), CheckError::Empty);
    let long = vec![mov64_imm(0, 0); 10];
    assert_eq!(
        Program::with_limits(&long, &Limits { max_insns: 5, ..Limits::default() }).unwrap_err(),
        CheckError::TooLong { len: 10, max: 5 }
    );
    assert_eq!(refuse(&[mov64_imm(0, 0)]), CheckError::FallsOffEnd { pc: 0 });
    assert_eq!(
        refuse(&[mov64_imm(0, 0), jmp_imm(jmp::JEQ, 0, 0, 1), exit(), mov64_imm(0, 1)]),
        CheckError::FallsOffEnd { pc: 3 }
    );
    assert_eq!(
        refuse(&[mov64_imm(0, 0), jmp_imm(jmp::JEQ, 0, 0, 1), exit()]),
        CheckError::JumpOutOfRange { pc: 1, target: 3, len: 3 }
    );
    assert_eq!(refuse(&[mov64_imm(0, 0), exit(), exit()]), CheckError::Unreachable { pc: 2 });
    assert_eq!(refuse(&[mov64_imm(0, 0), ja(-3), exit()]), CheckError::JumpOutOfRange { pc: 1, target: -1, len: 3 });
    let [lo, hi] = Insn::ld_imm64(0, 5);
    assert_eq!(refuse(&[ja(1), lo, hi, exit()]), CheckError::JumpIntoLdImm64 { pc: 0, target: 2 });
    assert_eq!(refuse(&[mov64_imm(0, 0), lo]), CheckError::IncompleteLdImm64 { pc: 1 });
    assert_eq!(refuse(&[lo, exit()]), CheckError::IncompleteLdImm64 { pc: 0 });
    let map = Insn::new(lo.code, 1, 1, 0, 3); // BPF_PSEUDO_MAP_FD
    assert_eq!(refuse(&[map, hi, mov64_imm(0, 0), exit()]), CheckError::UnsupportedLdImm64 { pc: 0, kind: 1 });
}

#[test]
fn opcodes_and_fields() {
    for code in [0xe7, 0xf4, 0x8e, 0x96, 0xe5, 0xf6, 0x01, 0x19, 0x60, 0xa3, 0x38] {
        let e = refuse(&with_ret0(&[Insn::new(code, 0, 0, 0, 0)]));
        assert!(matches!(e, CheckError::UnknownOpcode { pc: 0, code: c } if c == code), "{code:#x}: {e:?}");
    }
    // Reserved fields: src in a K form, imm in an X form, off where none is taken.
    for insn in [
        Insn::new(class::ALU64 | alu::ADD | src::K, 0, 3, 0, 1),
        Insn::new(class::ALU64 | alu::ADD | src::X, 0, 1, 0, 1),
        Insn::new(class::ALU64 | alu::ADD | src::K, 0, 0, 1, 1),
        Insn::new(class::ALU | alu::NEG, 0, 0, 0, 5),
        Insn::new(class::ALU64 | alu::MOV | src::X, 0, 1, 7, 0),
        Insn::new(class::ALU | alu::MOV | src::X, 0, 1, 32, 0),
        Insn::new(class::JMP | jmp::JEQ | src::X, 0, 1, 0, 9),
        #[allow(clippy::identity_op)] // the encoding spelled out: LD is class 0
        Insn::new(class::LD | mode::ABS, 3, 0, 0, 0),
        Insn::new(class::LDX | mode::MEM, 0, 10, -8, 4),
    ] {
        let mut p = vec![mov64_imm(0, 0), mov64_imm(1, 0), mov64_reg(6, 1)];
        p.push(insn);
        p.extend_from_slice(&RET0);
        assert!(matches!(refuse(&p), CheckError::ReservedField { pc: 3, .. }), "{insn:?}");
    }
    assert!(matches!(refuse(&[Insn::new(0x95, 0, 0, 0, 1)]), CheckError::ReservedField { pc: 0, .. }));
    assert!(matches!(refuse(&[Insn::new(0x9d, 0, 0, 0, 0)]), CheckError::ReservedField { pc: 0, .. }));
    assert!(matches!(refuse(&with_ret0(&[Insn::new(0x0e, 0, 0, 0, 0)])), CheckError::ReservedField { pc: 0, .. }));
}

#[test]
fn registers() {
    assert_eq!(refuse(&with_ret0(&[mov64_imm(11, 0)])), CheckError::BadRegister { pc: 0, reg: 11 });
    assert_eq!(refuse(&with_ret0(&[mov64_reg(0, 12)])), CheckError::BadRegister { pc: 0, reg: 12 });
    assert_eq!(refuse(&with_ret0(&[mov64_imm(10, 0)])), CheckError::FramePointerWrite { pc: 0 });
    assert_eq!(refuse(&with_ret0(&[ldx(DW, 10, 10, -8)])), CheckError::FramePointerWrite { pc: 0 });
    // Read before written: directly, after a call, after LD_ABS, on one path only.
    assert_eq!(refuse(&[mov64_reg(0, 3), exit()]), CheckError::UninitializedRegister { pc: 0, reg: 3 });
    assert_eq!(refuse(&[exit()]), CheckError::UninitializedRegister { pc: 0, reg: 0 });
    let after_call = [
        mov64_reg(6, 1),
        mov64_imm(2, 0),
        mov64_reg(3, 10),
        alu64_imm(alu::ADD, 3, -8),
        mov64_imm(4, 8),
        call(26),
        mov64_reg(0, 2),
        exit(),
    ];
    assert_eq!(refuse(&after_call), CheckError::UninitializedRegister { pc: 6, reg: 2 });
    let after_ld_abs = [mov64_reg(6, 1), ld_abs(B, 0), alu64_reg(alu::ADD, 0, 1), exit()];
    assert_eq!(refuse(&after_ld_abs), CheckError::UninitializedRegister { pc: 2, reg: 1 });
    let no_r6 = [ld_abs(B, 0), exit()];
    assert_eq!(refuse(&no_r6), CheckError::UninitializedRegister { pc: 0, reg: 6 });
    let one_path = [mov64_imm(0, 1), jmp_imm(jmp::JEQ, 1, 0, 1), mov64_imm(2, 7), mov64_reg(0, 2), exit()];
    assert_eq!(refuse(&one_path), CheckError::UninitializedRegister { pc: 3, reg: 2 });
}

#[test]
fn stack_bounds_and_alignment() {
    assert_eq!(refuse(&with_ret0(&[st(DW, 10, -520, 0)])), CheckError::StackOutOfBounds { pc: 0, off: -520, size: 8 });
    assert_eq!(refuse(&with_ret0(&[st(W, 10, -2, 0)])), CheckError::StackOutOfBounds { pc: 0, off: -2, size: 4 });
    assert_eq!(refuse(&with_ret0(&[st(B, 10, 0, 0)])), CheckError::StackOutOfBounds { pc: 0, off: 0, size: 1 });
    assert_eq!(refuse(&with_ret0(&[st(W, 10, -6, 0)])), CheckError::MisalignedStack { pc: 0, off: -6, size: 4 });
    // The whole stack is usable.
    let p = [st(DW, 10, -512, 7), st(B, 10, -1, 1), ldx(DW, 0, 10, -512), exit()];
    assert_eq!(run(&p, b""), Ok(7));
}

#[test]
fn calls_and_constants() {
    assert_eq!(refuse(&with_ret0(&[call(1)])), CheckError::UnknownHelper { pc: 0, id: 1 });
    assert_eq!(refuse(&with_ret0(&[call(12)])), CheckError::UnknownHelper { pc: 0, id: 12 });
    let bpf2bpf = Insn::new(class::JMP | jmp::CALL, 0, pseudo::CALL, 0, 1);
    assert!(matches!(refuse(&with_ret0(&[bpf2bpf])), CheckError::UnsupportedCall { pc: 0, .. }));
    let kfunc = Insn::new(class::JMP | jmp::CALL, 0, pseudo::KFUNC_CALL, 0, 1);
    assert!(matches!(refuse(&with_ret0(&[kfunc])), CheckError::UnsupportedCall { pc: 0, .. }));
    assert_eq!(refuse(&[mov64_imm(0, 1), alu64_imm(alu::DIV, 0, 0), exit()]), CheckError::DivisionByZero { pc: 1 });
    assert_eq!(refuse(&[mov64_imm(0, 1), alu32_imm(alu::MOD, 0, 0), exit()]), CheckError::DivisionByZero { pc: 1 });
    assert_eq!(
        refuse(&[mov64_imm(0, 1), alu64_imm(alu::LSH, 0, 64), exit()]),
        CheckError::BadShift { pc: 1, amount: 64 }
    );
    assert_eq!(
        refuse(&[mov64_imm(0, 1), alu32_imm(alu::ARSH, 0, 32), exit()]),
        CheckError::BadShift { pc: 1, amount: 32 }
    );
    assert_eq!(
        refuse(&[mov64_imm(0, 1), alu64_imm(alu::RSH, 0, -1), exit()]),
        CheckError::BadShift { pc: 1, amount: -1 }
    );
    assert_eq!(refuse(&[mov64_imm(0, 1), endian(true, 0, 8), exit()]), CheckError::BadByteSwap { pc: 1, width: 8 });
    assert_eq!(refuse(&[mov64_imm(0, 1), bswap(0, 48), exit()]), CheckError::BadByteSwap { pc: 1, width: 48 });
    let bad_atomic = Insn::new(class::STX | mode::ATOMIC | DW, 10, 0, -8, 0x10);
    assert_eq!(
        refuse(&[mov64_imm(0, 1), st(DW, 10, -8, 0), bad_atomic, exit()]),
        CheckError::BadAtomic { pc: 2, op: 0x10 }
    );
    let byte_atomic = Insn::new(class::STX | mode::ATOMIC | B, 10, 0, -8, atomic::ADD);
    assert!(matches!(refuse(&[mov64_imm(0, 1), byte_atomic, exit()]), CheckError::UnknownOpcode { pc: 1, .. }));
}

#[test]
fn budget_stops_a_loop_and_is_exact() {
    // r0 counts down from N: 2 + 3N instructions run (mov, N × (sub, jne... ), exit).
    let countdown = |n: i32| vec![mov64_imm(0, n), alu64_imm(alu::SUB, 0, 1), jmp_imm(jmp::JNE, 0, 0, -2), exit()];
    let limits = Limits { budget: 2 + 2 * 100, ..Limits::default() };
    let p = Program::with_limits(&countdown(100), &limits).unwrap();
    assert_eq!(p.run(&mut Vm::new(), b""), Ok(0));
    let p = Program::with_limits(&countdown(101), &limits).unwrap();
    assert_eq!(p.run(&mut Vm::new(), b""), Err(Fault::Budget { budget: 202 }));
    // The default budget stops an endless loop.
    let spin = [mov64_imm(0, 0), jmp_imm(jmp::JEQ, 0, 0, -1), exit()];
    assert_eq!(run(&spin, b""), Err(Fault::Budget { budget: Limits::default().budget }));
}

#[test]
fn run_time_memory_checks() {
    // A computed pointer past the top of the stack.
    let p = [mov64_reg(2, 10), alu64_imm(alu::ADD, 2, 4), ldx(W, 0, 2, 0), exit()];
    assert!(matches!(run(&p, b""), Err(Fault::Memory { pc: 2, size: 4, .. })));
    // A number used as a pointer.
    let p = [mov64_imm(2, 0x1000), ldx(B, 0, 2, 0), exit()];
    assert!(matches!(run(&p, b""), Err(Fault::Memory { pc: 1, addr: 0x1000, size: 1 })));
    // Context fields other than len (read) and cb (read/write).
    let p = [ldx(W, 0, 1, 4), exit()];
    assert_eq!(run(&p, b""), Err(Fault::Context { pc: 0, off: 4, size: 4, write: false }));
    let p = [mov64_imm(2, 1), stx(W, 1, 2, 0), mov64_imm(0, 0), exit()];
    assert_eq!(run(&p, b""), Err(Fault::Context { pc: 1, off: 0, size: 4, write: true }));
    let p = [ldx(W, 0, 1, 66), exit()];
    assert!(matches!(run(&p, b""), Err(Fault::Context { off: 66, .. })), "cb[4] + 2 is not aligned for 4");
    // Helper arguments.
    let helper = |r1_ctx: bool, dst: i32, len: i32| {
        let mut v = vec![mov64_reg(6, 1)];
        if !r1_ctx {
            v.push(mov64_imm(1, 0));
        }
        v.extend([mov64_imm(2, 0), mov64_reg(3, 10), alu64_imm(alu::ADD, 3, dst), mov64_imm(4, len), call(26), exit()]);
        v
    };
    assert_eq!(run(&helper(true, -8, 8), b"0123456789"), Ok(0));
    assert!(matches!(run(&helper(false, -8, 8), b"0123456789"), Err(Fault::Helper { pc: 6, .. })));
    assert!(matches!(run(&helper(true, -8, 9), b"0123456789"), Err(Fault::Helper { pc: 5, .. })));
    assert!(matches!(run(&helper(true, -8, 0), b"0123456789"), Err(Fault::Helper { pc: 5, .. })));
}

#[test]
fn message_loads_in_network_order_with_exact_bounds() {
    let word = [mov64_reg(6, 1), ld_abs(W, 0), alu64_imm(alu::ADD, 0, 4), exit()];
    assert_eq!(run(&word, &[0, 0, 0, 10]), Ok(14));
    assert_eq!(run(&word, &[0, 0, 0]), Ok(0), "3 bytes: out of range ends with 0");
    assert_eq!(run(&word, &[0x80, 0, 0, 0]), Ok(0x8000_0004), "zero-extended, not sign-extended");
    let half = [mov64_reg(6, 1), ld_abs(H, 2), exit()];
    assert_eq!(run(&half, &[9, 9, 0x12, 0x34]), Ok(0x1234));
    assert_eq!(run(&half, &[9, 9, 0x12]), Ok(0));
    // LD_IND: src + imm as a 32-bit int; negative is out of range.
    let ind = |off: i32| [mov64_reg(6, 1), mov64_imm(7, off), ld_ind(B, 7, 1), exit()];
    assert_eq!(run(&ind(2), &[0, 1, 2, 3]), Ok(3));
    assert_eq!(run(&ind(3), &[0, 1, 2, 3]), Ok(0));
    assert_eq!(run(&ind(-1), &[5, 1, 2, 3]), Ok(5));
    assert_eq!(run(&ind(-2), &[5, 1, 2, 3]), Ok(0));
    assert_eq!(run(&ind(-0x100000), &[5; 64]), Ok(0), "SKF_NET_OFF area reads nothing");
    // skb->len and its narrow reads.
    let len = [ldx(W, 0, 1, 0), exit()];
    assert_eq!(run(&len, &[0; 300]), Ok(300));
    let len_hi = [ldx(B, 0, 1, 1), exit()];
    assert_eq!(run(&len_hi, &[0; 300]), Ok(1));
    // bpf_skb_load_bytes: -EFAULT and a cleared destination when short.
    let load = [
        mov64_reg(6, 1),
        st(DW, 10, -8, -1),
        mov64_imm(2, 1),
        mov64_reg(3, 10),
        alu64_imm(alu::ADD, 3, -8),
        mov64_imm(4, 4),
        call(26),
        mov64_reg(7, 0),
        ldx(DW, 0, 10, -8),
        alu64_imm(alu::LSH, 7, 40),
        alu64_reg(alu::XOR, 0, 7),
        exit(),
    ];
    assert_eq!(run(&load, b"abcde"), Ok(0xffff_ffff_6564_6362));
    assert_eq!(run(&load, b"abcd"), Ok(0xffff_ffff_0000_0000 ^ ((-14i64 as u64) << 40)));
}

#[test]
fn alu_corner_cases() {
    let div0 = [mov64_imm(0, 9), mov64_imm(1, 0), alu64_reg(alu::DIV, 0, 1), exit()];
    assert_eq!(run(&div0, b""), Ok(0));
    let mod0 = [mov64_imm(0, -9), mov64_imm(1, 0), alu64_reg(alu::MOD, 0, 1), exit()];
    assert_eq!(run(&mod0, b""), Ok(-9i64 as u64));
    let mod0_32 = [mov64_imm(0, -9), mov64_imm(1, 0), alu32_reg(alu::MOD, 0, 1), exit()];
    assert_eq!(run(&mod0_32, b""), Ok(-9i32 as u32 as u64), "32-bit: the dividend, zero-extended");
    // Only the low 32 bits of the divisor count for 32-bit division.
    let div_hi = [
        mov64_imm(0, 9),
        Insn::ld_imm64(1, 1 << 32)[0],
        Insn::ld_imm64(1, 1 << 32)[1],
        alu32_reg(alu::DIV, 0, 1),
        exit(),
    ];
    assert_eq!(run(&div_hi, b""), Ok(0));
    let sdiv_min = [
        Insn::ld_imm64(0, i64::MIN as u64)[0],
        Insn::ld_imm64(0, i64::MIN as u64)[1],
        mov64_imm(1, -1),
        Insn::new(class::ALU64 | alu::DIV | src::X, 0, 1, 1, 0),
        exit(),
    ];
    assert_eq!(run(&sdiv_min, b""), Ok(i64::MIN as u64));
    let shift = [mov64_imm(0, 1), mov64_imm(1, 65), alu64_reg(alu::LSH, 0, 1), exit()];
    assert_eq!(run(&shift, b""), Ok(2), "register shifts are modulo the width");
    let shift32 = [mov64_imm(0, 1), mov64_imm(1, 33), alu32_reg(alu::LSH, 0, 1), exit()];
    assert_eq!(run(&shift32, b""), Ok(2));
    let arsh32 = [mov64_imm(0, -16), alu32_imm(alu::ARSH, 0, 2), exit()];
    assert_eq!(run(&arsh32, b""), Ok(0xffff_fffc), "32-bit result zero-extended");
    let to_be = [
        Insn::ld_imm64(0, 0x1122_3344_5566_7788)[0],
        Insn::ld_imm64(0, 0x1122_3344_5566_7788)[1],
        endian(true, 0, 32),
        exit(),
    ];
    assert_eq!(run(&to_be, b""), Ok(0x8877_6655));
    let to_le = [
        Insn::ld_imm64(0, 0x1122_3344_5566_7788)[0],
        Insn::ld_imm64(0, 0x1122_3344_5566_7788)[1],
        endian(false, 0, 16),
        exit(),
    ];
    assert_eq!(run(&to_le, b""), Ok(0x7788));
    let sw = [
        Insn::ld_imm64(0, 0x1122_3344_5566_7788)[0],
        Insn::ld_imm64(0, 0x1122_3344_5566_7788)[1],
        bswap(0, 64),
        exit(),
    ];
    assert_eq!(run(&sw, b""), Ok(0x8877_6655_4433_2211));
}

#[test]
fn stack_is_cleared_between_runs() {
    // Reads what it wrote last time if the stack were kept: it must not be.
    let p = Program::new(&[ldx(DW, 0, 10, -8), mov64_imm(1, 42), stx(DW, 10, 1, -8), exit()]).unwrap();
    let mut vm = Vm::new();
    assert_eq!(p.run(&mut vm, b""), Ok(0));
    assert_eq!(p.run(&mut vm, b""), Ok(0));
    // Same when the frame pointer escapes into another register.
    let q =
        Program::new(&[mov64_reg(2, 10), ldx(DW, 0, 2, -504), mov64_imm(1, 42), stx(DW, 2, 1, -504), exit()]).unwrap();
    assert_eq!(q.run(&mut vm, b""), Ok(0));
    assert_eq!(q.run(&mut vm, b""), Ok(0));
}

#[test]
fn parser_mapping() {
    assert_eq!(parse_result(10), Parse::Length(10));
    assert_eq!(parse_result(0), Parse::NeedMore(1));
    assert_eq!(parse_result(-22i32 as u32), Parse::Invalid(ParseError::Program(22)));
    assert_eq!(parse_result(0x8000_0000), Parse::Invalid(ParseError::Program(i32::MIN)));
    // Only the low 32 bits of r0 count, as a socket filter's return.
    let code: Vec<u8> = [Insn::ld_imm64(0, 0x1_0000_0005)[0], Insn::ld_imm64(0, 0x1_0000_0005)[1], exit()]
        .iter()
        .flat_map(|i| i.to_bytes())
        .collect();
    let mut p = BpfParser::from_raw(&code).unwrap();
    assert_eq!(p.parse(b""), Parse::Length(5));
    assert_eq!(p.name(), "bpf:raw");
    let spin: Vec<u8> =
        [mov64_imm(0, 0), jmp_imm(jmp::JEQ, 0, 0, -1), exit()].iter().flat_map(|i| i.to_bytes()).collect();
    let mut p = BpfParser::from_raw(&spin).unwrap();
    assert!(matches!(p.parse(b"x"), Parse::Invalid(ParseError::ProgramFault(why)) if why.contains("budget")));
    assert!(matches!(BpfParser::from_raw(&code[..12]), Err(LoadError::NotWholeInstructions { len: 12 })));
    assert!(matches!(BpfParser::from_raw(&[]), Err(LoadError::Check(CheckError::Empty))));
}
