//! The interpreter against the kernel: every program is loaded into the running
//! kernel as a socket filter (`BPF_PROG_LOAD`) and run there with
//! `BPF_PROG_TEST_RUN` on the same bytes as here. The kernel's 32-bit return value
//! is the oracle. Needs root (CAP_BPF); fails, does not skip, without it.
//!
//! What is compared:
//! - every program in `bpf/` (each C file, each instruction set clang offers,
//!   each section) on at least 10,000 inputs: random, short headers, length
//!   fields at interesting values and exact boundaries, per-protocol messages
//!   cut at every length;
//! - hand-written programs for what clang does not emit from `bpf/`: `LD_IND` at
//!   every size and at large offsets, narrow reads of `skb->len`, `cb[]`, the BPF
//!   v4 instructions, division by a zero register, `bpf_skb_load_bytes` at edge
//!   offsets and variable lengths;
//! - random straight-line-and-forward-branch programs over the whole ALU, JMP,
//!   JMP32, stack, atomic, `LD_IND` and helper repertoire;
//! - hostile programs, which both refuse (or, for a loop, the kernel refuses and
//!   the budget stops here).

mod common;

use std::os::fd::{AsFd, OwnedFd};

use common::corpus;
use common::{program_cases, Rng};
use connmux_bpf::asm::*;
use connmux_bpf::insn::{alu, atomic, class, jmp, mode, src, Insn};
use connmux_bpf::{parse_result, BpfParser, CheckError, Fault, Program, Vm};
use connmux_core::{Parse, Parser};
use connmux_sys::bpf::{prog_load_socket_filter, prog_test_run};

/// The Ethernet header the kernel strips before running a socket filter.
const ETH: [u8; 14] = [0; 14];

fn kernel_load(insns: &[Insn], what: &str) -> OwnedFd {
    let raw = connmux_bpf::insn::encode(insns);
    match prog_load_socket_filter(&raw, "GPL") {
        Ok(fd) => fd,
        Err(e) if e.raw_os_error() == Some(1) => {
            panic!("BPF_PROG_LOAD: permission denied: the kernel oracle tests need root (CAP_BPF, CAP_PERFMON)")
        }
        Err(e) => {
            // The verifier's log ends with why.
            let text = e.to_string();
            let lines: Vec<&str> = text.lines().collect();
            let tail = lines[lines.len().saturating_sub(15)..].join("\n");
            panic!("the kernel refused {what}: {tail}\nprogram: {insns:?}")
        }
    }
}

fn kernel_run(fd: &OwnedFd, msg: &[u8]) -> u32 {
    let mut frame = Vec::with_capacity(ETH.len() + msg.len());
    frame.extend_from_slice(&ETH);
    frame.extend_from_slice(msg);
    match prog_test_run(fd.as_fd(), &frame) {
        Ok(v) => v,
        Err(e) if e.raw_os_error() == Some(1) => {
            panic!("BPF_PROG_TEST_RUN: permission denied: the kernel oracle tests need root")
        }
        Err(e) => panic!("BPF_PROG_TEST_RUN failed on {} bytes: {e}", msg.len()),
    }
}

#[derive(Default, Debug)]
struct Tally {
    inputs: usize,
    lengths: usize,
    need_more: usize,
    errors: usize,
    disagree: usize,
    examples: Vec<String>,
}

impl Tally {
    fn line(&self) -> String {
        format!(
            "{} inputs, {} agree (length {}, need more {}, error {})",
            self.inputs,
            self.inputs - self.disagree,
            self.lengths,
            self.need_more,
            self.errors
        )
    }
}

fn hex(b: &[u8]) -> String {
    let shown: String = b.iter().take(48).map(|x| format!("{x:02x}")).collect();
    if b.len() > 48 {
        format!("{shown}… ({} bytes)", b.len())
    } else {
        format!("{shown} ({} bytes)", b.len())
    }
}

/// Run `inputs` through the kernel and through both the program and a
/// `BpfParser` on it; count the kinds of answers and the disagreements.
fn compare(prog: &Program, parser: &mut BpfParser, fd: &OwnedFd, inputs: &[Vec<u8>]) -> Tally {
    let mut vm = Vm::new();
    let mut t = Tally::default();
    for msg in inputs {
        t.inputs += 1;
        let k = kernel_run(fd, msg);
        let ours = prog.run(&mut vm, msg);
        match parse_result(k) {
            Parse::Length(_) => t.lengths += 1,
            Parse::NeedMore(_) => t.need_more += 1,
            Parse::Invalid(_) => t.errors += 1,
        }
        let agree = matches!(ours, Ok(r0) if r0 as u32 == k) && parser.parse(msg) == parse_result(k);
        if !agree {
            t.disagree += 1;
            if t.examples.len() < 10 {
                t.examples.push(format!("input {}: kernel {k:#x}, here {ours:x?}", hex(msg)));
            }
        }
    }
    t
}

fn assert_agree(label: &str, t: &Tally) {
    assert!(
        t.disagree == 0,
        "{label}: {} of {} inputs disagree with the kernel, for example:\n{}",
        t.disagree,
        t.inputs,
        t.examples.join("\n")
    );
}

#[test]
fn bpf_programs_agree_with_kernel() {
    let cases = program_cases();
    let mut rng = Rng::new(0x5eed_0001);
    let mut total = 0;
    let mut sources = std::collections::BTreeSet::new();
    for case in &cases {
        let mut parser = BpfParser::from_elf_file(&case.object, case.section.as_deref())
            .unwrap_or_else(|e| panic!("{}: {e}", case.label));
        let prog = parser.program().clone();
        let fd = kernel_load(prog.insns(), &case.label);
        let mut inputs = corpus::specific(&case.source, &mut rng, 5_000);
        inputs.extend(corpus::generic(&mut rng, 10_000usize.saturating_sub(inputs.len()).max(5_000)));
        let t = compare(&prog, &mut parser, &fd, &inputs);
        println!("{:<36} {} insns: {}", case.label, prog.insns().len(), t.line());
        assert_agree(&case.label, &t);
        assert!(t.inputs >= 10_000, "{}: only {} inputs", case.label, t.inputs);
        // The inputs reach every kind of answer, or the comparison says little.
        assert!(t.lengths > 0 && t.need_more > 0 && t.errors > 0, "{}: {}", case.label, t.line());
        total += t.inputs;
        sources.insert(case.source.clone());
    }
    for s in ["len_prefix", "oncrpc", "thrift", "ninep", "http2"] {
        assert!(sources.contains(s), "bpf/{s}.c was not compared");
    }
    println!("{} programs from {} sources, {} inputs, all agree with the kernel", cases.len(), sources.len(), total);
}

/// Hand-written programs for what clang does not emit from `bpf/`.
fn hand_written() -> Vec<(&'static str, Vec<Insn>)> {
    use alu::*;
    let sdiv64 = |d, s| Insn::new(class::ALU64 | DIV | src::X, d, s, 1, 0);
    let smod32 = |d, s| Insn::new(class::ALU | MOD | src::X, d, s, 1, 0);
    let movsx64 = |d, s, w| Insn::new(class::ALU64 | MOV | src::X, d, s, w, 0);
    let movsx32 = |d, s, w| Insn::new(class::ALU | MOV | src::X, d, s, w, 0);
    let ldsx = |sz, d, s, off| Insn::new(class::LDX | mode::MEMSX | sz, d, s, off, 0);
    let fold = [alu64_reg(MOV, 1, 0), alu64_imm(RSH, 1, 32), alu64_reg(XOR, 0, 1), exit()];
    let with_fold = |mut v: Vec<Insn>| {
        v.extend_from_slice(&fold);
        v
    };
    vec![
        (
            "ld_ind at every size, offset from byte 0",
            vec![
                mov64_reg(6, 1),
                ld_abs(B, 0),
                mov64_reg(7, 0),
                ld_ind(W, 7, 1),
                mov64_reg(8, 0),
                ld_ind(H, 7, 3),
                alu64_imm(LSH, 0, 7),
                alu64_reg(XOR, 8, 0),
                ld_ind(B, 7, 0),
                alu64_reg(XOR, 0, 8),
                exit(),
            ],
        ),
        (
            "ld_ind at large offsets (word 0 & 0x7fffffff, + 5)",
            vec![
                mov64_reg(6, 1),
                ld_abs(W, 0),
                mov64_reg(7, 0),
                alu64_imm(AND, 7, 0x7fff_ffff),
                ld_ind(H, 7, 5),
                alu64_imm(ADD, 0, 1),
                exit(),
            ],
        ),
        (
            "ld_ind, offset register with high bits set (truncated to 32 bits)",
            vec![
                mov64_reg(6, 1),
                ld_abs(B, 1),
                mov64_reg(7, 0),
                ld_abs(B, 0),
                alu64_imm(LSH, 0, 40),
                alu64_reg(OR, 7, 0),
                ld_ind(W, 7, 2),
                exit(),
            ],
        ),
        (
            "narrow reads of skb->len",
            vec![
                ldx(W, 2, 1, 0),
                ldx(H, 3, 1, 0),
                ldx(H, 4, 1, 2),
                ldx(B, 5, 1, 1),
                mov64_reg(0, 2),
                alu64_imm(MUL, 0, 3),
                alu64_reg(ADD, 0, 3),
                alu64_imm(LSH, 4, 16),
                alu64_reg(XOR, 0, 4),
                alu64_imm(LSH, 5, 24),
                alu64_reg(XOR, 0, 5),
                exit(),
            ],
        ),
        (
            "cb[] as scratch",
            vec![
                ldx(W, 2, 1, 0),
                stx(W, 1, 2, 48),
                stx(H, 1, 2, 58),
                ldx(B, 3, 1, 48),
                ldx(DW, 4, 1, 56),
                ldx(W, 0, 1, 64),
                alu64_reg(ADD, 0, 3),
                alu64_reg(XOR, 0, 4),
                alu64_imm(ADD, 0, 1),
                exit(),
            ],
        ),
        (
            "BPF v4: bswap, sign-extending moves and loads, signed div/mod",
            with_fold(vec![
                mov64_reg(6, 1),
                ld_abs(W, 0),
                mov64_reg(7, 0),
                ld_abs(W, 4),
                mov64_reg(8, 0),
                alu64_imm(LSH, 7, 32),
                alu64_reg(OR, 7, 8),
                mov64_reg(9, 7),
                bswap(9, 64),
                movsx64(2, 7, 8),
                movsx64(3, 8, 16),
                movsx64(4, 7, 32),
                movsx32(5, 8, 8),
                stx(DW, 10, 7, -8),
                ldsx(B, 1, 10, -8),
                ldsx(H, 8, 10, -6),
                ldsx(W, 7, 10, -4),
                mov64_reg(0, 9),
                alu64_reg(XOR, 0, 2),
                alu64_reg(ADD, 0, 3),
                alu64_reg(XOR, 0, 4),
                alu64_reg(ADD, 0, 5),
                alu64_reg(XOR, 0, 1),
                alu64_reg(ADD, 0, 7),
                sdiv64(0, 8),
                smod32(0, 3),
                bswap(0, 16),
                alu64_reg(ADD, 0, 9),
                bswap(9, 32),
                alu64_reg(XOR, 0, 9),
            ]),
        ),
        (
            "END to big- and little-endian at every width",
            with_fold(vec![
                mov64_reg(6, 1),
                ld_abs(W, 0),
                mov64_reg(7, 0),
                ld_abs(W, 4),
                alu64_imm(LSH, 7, 32),
                alu64_reg(OR, 7, 0),
                mov64_reg(0, 7),
                endian(true, 0, 64),
                mov64_reg(1, 7),
                endian(true, 1, 32),
                mov64_reg(2, 7),
                endian(true, 2, 16),
                mov64_reg(3, 7),
                endian(false, 3, 16),
                mov64_reg(4, 7),
                endian(false, 4, 32),
                alu64_reg(XOR, 0, 1),
                alu64_imm(MUL, 0, 31),
                alu64_reg(XOR, 0, 2),
                alu64_imm(MUL, 0, 31),
                alu64_reg(XOR, 0, 3),
                alu64_imm(MUL, 0, 31),
                alu64_reg(XOR, 0, 4),
                endian(false, 7, 64),
                alu64_reg(ADD, 0, 7),
            ]),
        ),
        (
            "division and modulo by a register that may be 0",
            with_fold(vec![
                mov64_reg(6, 1),
                ld_abs(W, 0),
                mov64_reg(7, 0),
                ld_abs(B, 4),
                mov64_reg(8, 0),
                mov64_reg(9, 7),
                alu64_reg(DIV, 9, 8),
                mov64_reg(2, 7),
                alu64_reg(MOD, 2, 8),
                mov64_reg(3, 7),
                alu64_imm(LSH, 3, 32),
                alu64_reg(OR, 3, 7),
                alu32_reg(DIV, 3, 8),
                mov64_reg(4, 7),
                alu64_imm(LSH, 4, 32),
                alu64_reg(OR, 4, 7),
                alu32_reg(MOD, 4, 8),
                mov64_reg(5, 7),
                sdiv64(5, 8),
                mov64_reg(1, 7),
                smod32(1, 8),
                mov64_reg(0, 9),
                alu64_imm(MUL, 0, 0x01000193),
                alu64_reg(XOR, 0, 2),
                alu64_imm(MUL, 0, 0x01000193),
                alu64_reg(XOR, 0, 3),
                alu64_imm(MUL, 0, 0x01000193),
                alu64_reg(XOR, 0, 4),
                alu64_imm(MUL, 0, 0x01000193),
                alu64_reg(XOR, 0, 5),
                alu64_imm(MUL, 0, 0x01000193),
                alu64_reg(XOR, 0, 1),
            ]),
        ),
        (
            "bpf_skb_load_bytes: offset from word 0, length 1..16 from byte 4",
            with_fold(vec![
                mov64_reg(6, 1),
                st(DW, 10, -16, 0x1111),
                st(DW, 10, -8, 0x2222),
                ld_abs(W, 0),
                mov64_reg(7, 0),
                ld_abs(B, 4),
                mov64_reg(8, 0),
                alu64_imm(AND, 8, 15),
                alu64_imm(ADD, 8, 1),
                mov64_reg(1, 6),
                mov64_reg(2, 7),
                mov64_reg(3, 10),
                alu64_imm(ADD, 3, -16),
                mov64_reg(4, 8),
                call(26),
                mov64_reg(7, 0),
                ldx(DW, 0, 10, -16),
                ldx(DW, 1, 10, -8),
                alu64_imm(MUL, 0, 31),
                alu64_reg(XOR, 0, 1),
                alu64_imm(MUL, 0, 31),
                alu64_reg(ADD, 0, 7),
            ]),
        ),
        (
            "bpf_skb_load_bytes: small offsets, whole 16 bytes",
            with_fold(vec![
                mov64_reg(6, 1),
                ld_abs(B, 0),
                mov64_reg(7, 0),
                alu64_imm(AND, 7, 31),
                mov64_reg(1, 6),
                mov64_reg(2, 7),
                mov64_reg(3, 10),
                alu64_imm(ADD, 3, -16),
                mov64_imm(4, 16),
                call(26),
                mov64_reg(7, 0),
                ldx(DW, 0, 10, -16),
                ldx(DW, 1, 10, -8),
                alu64_imm(MUL, 0, 31),
                alu64_reg(XOR, 0, 1),
                alu64_reg(ADD, 0, 7),
            ]),
        ),
    ]
}

#[test]
fn hand_written_programs_agree_with_kernel() {
    let mut rng = Rng::new(0x5eed_0002);
    let mut total = 0;
    let progs = hand_written();
    for (what, insns) in &progs {
        let prog = Program::new(insns).unwrap_or_else(|e| panic!("{what}: {e}"));
        let mut parser = BpfParser::new(std::sync::Arc::new(prog.clone()), "hand");
        let fd = kernel_load(insns, what);
        let inputs = corpus::generic(&mut rng, 10_000);
        let t = compare(&prog, &mut parser, &fd, &inputs);
        println!("{what:<68} {}", t.line());
        assert_agree(what, &t);
        total += t.inputs;
    }
    println!("{} hand-written programs, {} inputs, all agree with the kernel", progs.len(), total);
}

/// Random programs: a prologue loads 72 input bytes into nine registers and the
/// stack, a body of random blocks (any ALU op, stack loads/stores/atomics,
/// `LD_IND`, the helper, forward branches), and an epilogue folds every register
/// and stack slot into the 32-bit result.
struct Gen<'a> {
    rng: &'a mut Rng,
}

const REGS: [u8; 9] = [0, 1, 2, 3, 4, 5, 7, 8, 9];
const SLOTS: i16 = 16;
const IMMS: [i32; 16] = [0, 1, -1, 2, 3, 7, 8, 31, 32, 63, 0xff, 0xffff, 0x7fff_ffff, i32::MIN, -2, 0x1234_5678];

/// One block: instructions, or a forward branch over the next `skip` blocks.
enum Block {
    Code(Vec<Insn>),
    Branch { cond: Insn, skip: usize, long: bool },
}

impl Gen<'_> {
    fn reg(&mut self) -> u8 {
        self.rng.pick(&REGS)
    }
    fn imm(&mut self) -> i32 {
        if self.rng.chance(60) {
            self.rng.pick(&IMMS)
        } else {
            self.rng.u32() as i32
        }
    }
    fn slot(&mut self) -> i16 {
        -8 * self.rng.range(1, SLOTS as u64 + 1) as i16
    }
    /// r1..r5 from random stack slots, after something left them unreadable.
    fn reload(&mut self, v: &mut Vec<Insn>) {
        for r in 1..=5 {
            let s = self.slot();
            v.push(ldx(DW, r, 10, s));
        }
    }

    fn alu(&mut self) -> Vec<Insn> {
        let ops = [
            alu::ADD,
            alu::SUB,
            alu::MUL,
            alu::DIV,
            alu::OR,
            alu::AND,
            alu::LSH,
            alu::RSH,
            alu::NEG,
            alu::MOD,
            alu::XOR,
            alu::MOV,
            alu::ARSH,
        ];
        let op = self.rng.pick(&ops);
        let is64 = self.rng.chance(50);
        let cls = if is64 { class::ALU64 } else { class::ALU };
        let d = self.reg();
        let mut v = Vec::new();
        if op == alu::NEG {
            v.push(Insn::new(cls | op, d, 0, 0, 0));
            return v;
        }
        let signed = matches!(op, alu::DIV | alu::MOD) && self.rng.chance(40);
        let off = signed as i16;
        if self.rng.chance(50) {
            let s = self.reg();
            if matches!(op, alu::DIV | alu::MOD) && self.rng.chance(25) {
                // A zero (or -1) divisor, the kernel's special cases.
                v.push(mov64_imm(s, self.rng.pick(&[0, -1, 0])));
            }
            v.push(Insn::new(cls | op | src::X, d, s, off, 0));
        } else {
            let mut k = self.imm();
            if matches!(op, alu::LSH | alu::RSH | alu::ARSH) {
                k = self.rng.below(if is64 { 64 } else { 32 }) as i32;
            }
            if matches!(op, alu::DIV | alu::MOD) && k == 0 {
                k = -1;
            }
            v.push(Insn::new(cls | op | src::K, d, 0, off, k));
        }
        v
    }

    fn block(&mut self) -> Block {
        let d = self.reg();
        let s = self.reg();
        let code = match self.rng.below(20) {
            0..=6 => self.alu(),
            7 => {
                // Sign-extending moves.
                if self.rng.chance(50) {
                    vec![Insn::new(class::ALU64 | alu::MOV | src::X, d, s, self.rng.pick(&[8, 16, 32]), 0)]
                } else {
                    vec![Insn::new(class::ALU | alu::MOV | src::X, d, s, self.rng.pick(&[8, 16]), 0)]
                }
            }
            8 => {
                let w = self.rng.pick(&[16, 32, 64]);
                match self.rng.below(3) {
                    0 => vec![endian(true, d, w)],
                    1 => vec![endian(false, d, w)],
                    _ => vec![bswap(d, w)],
                }
            }
            9 => Insn::ld_imm64(d, self.rng.u64()).to_vec(),
            10..=11 => {
                // A store into a slot, at any aligned place inside it.
                let sz = self.rng.pick(&[B, H, W, DW]);
                let n = match sz {
                    B => 1,
                    H => 2,
                    W => 4,
                    _ => 8,
                };
                let off = self.slot() + (self.rng.below(8 / n) * n) as i16;
                if self.rng.chance(50) {
                    vec![stx(sz, 10, s, off)]
                } else {
                    vec![st(sz, 10, off, self.imm())]
                }
            }
            12..=13 => {
                let sz = self.rng.pick(&[B, H, W, DW]);
                let n = match sz {
                    B => 1,
                    H => 2,
                    W => 4,
                    _ => 8,
                };
                let off = self.slot() + (self.rng.below(8 / n) * n) as i16;
                if sz != DW && self.rng.chance(40) {
                    vec![Insn::new(class::LDX | mode::MEMSX | sz, d, 10, off, 0)]
                } else {
                    vec![ldx(sz, d, 10, off)]
                }
            }
            14 => {
                let wide = self.rng.chance(50);
                let sz = if wide { DW } else { W };
                let off = self.slot() + if wide { 0 } else { 4 * self.rng.below(2) as i16 };
                let op = self.rng.pick(&[
                    atomic::ADD,
                    atomic::OR,
                    atomic::AND,
                    atomic::XOR,
                    atomic::ADD | atomic::FETCH,
                    atomic::OR | atomic::FETCH,
                    atomic::AND | atomic::FETCH,
                    atomic::XOR | atomic::FETCH,
                    atomic::XCHG,
                    atomic::CMPXCHG,
                ]);
                vec![Insn::new(class::STX | mode::ATOMIC | sz, 10, s, off, op)]
            }
            15 => {
                // LD_IND at a small offset from a register; r1-r5 are lost after.
                let mask = self.rng.pick(&[0x3f, 0x1f, 0x7f]);
                let mut v = vec![mov64_reg(0, s), alu64_imm(alu::AND, 0, mask)];
                v.push(ld_ind(self.rng.pick(&[B, H, W]), 0, self.rng.below(16) as i32));
                self.reload(&mut v);
                v
            }
            16 => {
                // The helper into a slot-aligned stack buffer.
                let len = self.rng.range(1, 17) as i32;
                let slots = (len + 7) / 8;
                let base = -8 * self.rng.range(slots as u64, SLOTS as u64 + 1) as i32;
                // The offset first: r1 is about to become the context.
                let mut v = if self.rng.chance(50) {
                    vec![mov64_reg(2, s), alu64_imm(alu::AND, 2, 0xff)]
                } else {
                    vec![mov64_imm(2, self.rng.below(200) as i32)]
                };
                v.extend([
                    mov64_reg(1, 6),
                    mov64_reg(3, 10),
                    alu64_imm(alu::ADD, 3, base),
                    mov64_imm(4, len),
                    call(26),
                ]);
                self.reload(&mut v);
                v
            }
            _ => {
                let ops = [
                    jmp::JEQ,
                    jmp::JGT,
                    jmp::JGE,
                    jmp::JSET,
                    jmp::JNE,
                    jmp::JSGT,
                    jmp::JSGE,
                    jmp::JLT,
                    jmp::JLE,
                    jmp::JSLT,
                    jmp::JSLE,
                ];
                let op = self.rng.pick(&ops);
                let cls = if self.rng.chance(50) { class::JMP } else { class::JMP32 };
                let cond = if self.rng.chance(50) {
                    Insn::new(cls | op | src::X, d, s, 0, 0)
                } else {
                    Insn::new(cls | op | src::K, d, 0, 0, self.imm())
                };
                return Block::Branch { cond, skip: self.rng.range(1, 4) as usize, long: self.rng.chance(20) };
            }
        };
        Block::Code(code)
    }

    fn program(&mut self) -> Vec<Insn> {
        let mut p = vec![mov64_reg(6, 1)];
        // Nine 64-bit values from the input's first 72 bytes into slots 1..9.
        for i in 0..9i16 {
            let slot = -8 * (i + 1);
            p.extend([
                ld_abs(W, 8 * i as i32),
                alu64_imm(alu::LSH, 0, 32),
                stx(DW, 10, 0, slot),
                ld_abs(W, 8 * i as i32 + 4),
                ldx(DW, 1, 10, slot),
                alu64_reg(alu::OR, 0, 1),
                stx(DW, 10, 0, slot),
            ]);
        }
        for i in 10..=SLOTS {
            let k = self.imm();
            p.push(st(DW, 10, -8 * i, k));
        }
        for (n, r) in REGS.iter().enumerate() {
            p.push(ldx(DW, *r, 10, -8 * (n as i16 + 1)));
        }

        let n = self.rng.range(8, 40) as usize;
        let blocks: Vec<Block> = (0..n).map(|_| self.block()).collect();
        let lens: Vec<usize> = blocks
            .iter()
            .map(|b| match b {
                Block::Code(v) => v.len(),
                Block::Branch { long: false, .. } => 1,
                Block::Branch { long: true, .. } => 2,
            })
            .collect();
        for (i, b) in blocks.iter().enumerate() {
            match b {
                Block::Code(v) => p.extend_from_slice(v),
                Block::Branch { cond, skip, long } => {
                    let end = (i + 1 + skip).min(n);
                    let dist: usize = lens[i + 1..end].iter().sum();
                    if *long {
                        // if cond goto +1; gotol over the next blocks (both reachable).
                        let mut c = *cond;
                        c.off = 1;
                        p.push(c);
                        p.push(Insn::new(class::JMP32 | jmp::JA, 0, 0, 0, dist as i32));
                    } else {
                        let mut c = *cond;
                        c.off = dist as i16;
                        p.push(c);
                    }
                }
            }
        }

        // Fold every register and slot into r0, then the high half into the low.
        for r in [1u8, 2, 3, 4, 5, 7, 8, 9] {
            p.push(alu64_imm(alu::MUL, 0, 0x5bd1_e995));
            p.push(alu64_reg(alu::XOR, 0, r));
        }
        for i in 1..=SLOTS {
            p.push(ldx(DW, 1, 10, -8 * i));
            p.push(alu64_imm(alu::MUL, 0, 0x5bd1_e995));
            p.push(alu64_reg(alu::XOR, 0, 1));
        }
        p.extend([mov64_reg(1, 0), alu64_imm(alu::RSH, 1, 32), alu64_reg(alu::XOR, 0, 1), exit()]);
        p
    }
}

#[test]
fn random_programs_agree_with_kernel() {
    // CONNMUX_BPF_SEED=N explores other programs; the default is fixed.
    let seed = std::env::var("CONNMUX_BPF_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0x5eed_0003);
    let mut rng = Rng::new(seed);
    let (programs, per) = (2000, 10);
    let mut runs = 0;
    let mut insns = 0;
    let mut early_zero = 0;
    for n in 0..programs {
        let prog_insns = Gen { rng: &mut rng }.program();
        insns += prog_insns.len();
        let prog = Program::new(&prog_insns)
            .unwrap_or_else(|e| panic!("random program {n} refused here: {e}\n{prog_insns:?}"));
        let fd = kernel_load(&prog_insns, &format!("random program {n}"));
        let mut vm = Vm::new();
        for _ in 0..per {
            let len = match rng.below(10) {
                0..=1 => rng.below(72),
                2..=7 => rng.range(72, 160),
                _ => rng.range(160, 300),
            } as usize;
            let msg = rng.bytes(len);
            let k = kernel_run(&fd, &msg);
            let ours = prog.run(&mut vm, &msg);
            // CONNMUX_BPF_BISECT=1: on a disagreement, say which instructions,
            // replaced by a no-op, make the two agree.
            if std::env::var("CONNMUX_BPF_BISECT").is_ok() && !matches!(ours, Ok(r0) if r0 as u32 == k) {
                for i in 0..prog_insns.len() {
                    let mut v = prog_insns.clone();
                    v[i] = ja(0);
                    let Ok(p2) = Program::new(&v) else { continue };
                    let raw = connmux_bpf::insn::encode(&v);
                    let Ok(fd2) = prog_load_socket_filter(&raw, "GPL") else { continue };
                    let k2 = kernel_run(&fd2, &msg);
                    let o2 = p2.run(&mut Vm::new(), &msg).unwrap();
                    if o2 as u32 == k2 {
                        println!("removing {i}: {:?} makes them agree", prog_insns[i]);
                    }
                }
                println!("msg {:02x?}", msg);
            }
            assert!(
                matches!(ours, Ok(r0) if r0 as u32 == k),
                "random program {n} on {}: kernel {k:#x}, here {ours:x?}\nprogram: {prog_insns:?}",
                hex(&msg)
            );
            early_zero += (k == 0) as usize;
            runs += 1;
        }
    }
    println!(
        "{programs} random programs ({} instructions on average), {runs} runs, all agree with the kernel ({early_zero} returned 0)",
        insns / programs
    );
    assert!(early_zero < runs / 2, "too many runs ended early: the comparison says little");
}

#[test]
fn hostile_programs_refused_by_kernel_and_here() {
    // Each is refused at load by the kernel; here at load too, except the loop,
    // which the budget stops.
    let infinite = vec![mov64_imm(0, 0), jmp_imm(jmp::JEQ, 0, 0, -1), exit()];
    let unknown_helper = vec![call(999), mov64_imm(0, 0), exit()];
    let out_of_range_jump = vec![mov64_imm(0, 0), ja(5), exit()];
    let stack_overflow = vec![st(DW, 10, -520, 1), mov64_imm(0, 0), exit()];
    let div_by_const_zero = vec![mov64_imm(0, 7), alu64_imm(alu::DIV, 0, 0), exit()];
    let uninit = vec![mov64_reg(0, 2), exit()];

    for (what, insns) in [
        ("infinite loop", &infinite),
        ("unknown helper", &unknown_helper),
        ("out-of-range jump", &out_of_range_jump),
        ("stack overflow", &stack_overflow),
        ("division by a constant 0", &div_by_const_zero),
        ("uninitialized register", &uninit),
    ] {
        let raw = connmux_bpf::insn::encode(insns);
        let err = prog_load_socket_filter(&raw, "GPL").expect_err(what);
        assert_ne!(err.raw_os_error(), Some(1), "permission denied: the kernel oracle tests need root");
        println!("kernel refuses {what}: {}", err.to_string().lines().last().unwrap_or(""));
    }

    let prog = Program::new(&infinite).expect("loops are stopped by the budget, not refused");
    assert_eq!(prog.run(&mut Vm::new(), b"abcd"), Err(Fault::Budget { budget: 1 << 20 }));
    assert!(matches!(Program::new(&unknown_helper), Err(CheckError::UnknownHelper { pc: 0, id: 999 })));
    assert!(matches!(Program::new(&out_of_range_jump), Err(CheckError::JumpOutOfRange { pc: 1, target: 7, len: 3 })));
    assert!(matches!(Program::new(&stack_overflow), Err(CheckError::StackOutOfBounds { pc: 0, off: -520, size: 8 })));
    assert!(matches!(Program::new(&div_by_const_zero), Err(CheckError::DivisionByZero { pc: 1 })));
    assert!(matches!(Program::new(&uninit), Err(CheckError::UninitializedRegister { pc: 0, reg: 2 })));

    // Division by a register holding 0: both give 0 (and modulo leaves the dividend).
    let div_reg_zero = vec![
        mov64_imm(0, 1000),
        mov64_imm(1, 0),
        alu64_reg(alu::DIV, 0, 1),
        mov64_imm(2, 77),
        alu64_reg(alu::MOD, 2, 1),
        alu64_reg(alu::ADD, 0, 2),
        exit(),
    ];
    let fd = kernel_load(&div_reg_zero, "division by a zero register");
    let ours = Program::new(&div_reg_zero).unwrap().run(&mut Vm::new(), b"").unwrap();
    assert_eq!(kernel_run(&fd, b""), 77);
    assert_eq!(ours, 77);
}
