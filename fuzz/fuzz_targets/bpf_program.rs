//! The BPF loader, checker and interpreter on arbitrary programs and data.
//!
//! Input: `[mode, budget, n_lo, n_hi, code (8 × n bytes)…, data…]` for raw
//! bytecode (mode even), or `[mode, budget, object…]` for an ELF object
//! (mode odd: every program it lists is loaded and run on a few bytes).
//!
//! Checked, for every program the checker accepts:
//! - a run ends with a value or a [`Fault`], never a panic, and a budget
//!   fault names the budget the program was loaded with;
//! - runs are deterministic: again on the same `Vm`, or on a fresh one, give
//!   the same answer (the stack and `cb` start from zero every run);
//! - the budget is honoured consistently: a run that ends within a budget
//!   ends the same way within four times that budget, and a run stopped by
//!   four times the budget is stopped by the budget too;
//! - `BpfParser` answers what `parse_result` makes of the run, and a stream
//!   parser driven by it (bytes in two pieces) never panics.
#![no_main]

use std::sync::Arc;

use connmux_bpf::{elf, insn, parse_result, BpfParser, Fault, Limits, Program, Vm};
use connmux_core::stream::{StreamLimits, StreamParser};
use connmux_core::{Parse, ParseError, Parser, Timestamp};
use libfuzzer_sys::fuzz_target;

/// Known defect of the ELF loader: choosing a program by a function symbol
/// whose address + size overflows a u64 panics (`elf.rs`, `sym.address() +
/// sym.size()`) instead of refusing the object. Reproduced by
/// `fuzz/regressions/bpf_program/elf-function-end-overflow` and the ignored test
/// in `crates/connmux-cli/tests/fuzz_regressions.rs`; set to true once the
/// loader checks that sum.
const SELECT_BY_FUNCTION: bool = true;

/// Known defect of the stream parser: a parser error `Program(i32::MIN)` (a
/// program returning 0x80000000) panics in `StreamParser::next_msg` on
/// `v.abs()` (overflow) where overflow checks are on. Reproduced by
/// `fuzz/regressions/bpf_program/program-returns-i32-min` and the ignored
/// test in `crates/connmux-cli/tests/fuzz_regressions.rs`; set to false once
/// the stream parser compares without `abs`.
const AVOID_PROGRAM_I32_MIN: bool = false;

/// [`BpfParser`] with the answer of [`AVOID_PROGRAM_I32_MIN`] replaced.
struct Guarded(BpfParser);

impl Parser for Guarded {
    fn parse(&mut self, buf: &[u8]) -> Parse {
        match self.0.parse(buf) {
            Parse::Invalid(ParseError::Program(i32::MIN)) if AVOID_PROGRAM_I32_MIN => {
                Parse::Invalid(ParseError::Program(connmux_core::parser::EPROTO))
            }
            p => p,
        }
    }
    fn name(&self) -> &str {
        self.0.name()
    }
}

/// Largest program taken (instruction slots): keeps the checker's work small.
const MAX_INSNS: usize = 1024;

fn exercise(insns: &[insn::Insn], budget: u64, data: &[u8]) {
    let limits = Limits { max_insns: MAX_INSNS, budget };
    let Ok(prog) = Program::with_limits(insns, &limits) else { return };
    let mut vm = Vm::new();
    let first = prog.run(&mut vm, data);
    if let Err(Fault::Budget { budget: b }) = &first {
        assert_eq!(*b, budget);
    }
    assert_eq!(prog.run(&mut vm, data), first, "same Vm, second run");
    assert_eq!(prog.run(&mut Vm::new(), data), first, "fresh Vm");
    // Other data in between must leave nothing behind.
    let _ = prog.run(&mut vm, &data[..data.len() / 2]);
    assert_eq!(prog.run(&mut vm, data), first, "after a run on other data");

    let wide = Program::with_limits(insns, &Limits { max_insns: MAX_INSNS, budget: budget * 4 })
        .expect("the checker does not depend on the budget");
    let more = wide.run(&mut Vm::new(), data);
    match (&first, &more) {
        (Err(Fault::Budget { .. }), _) => {}
        (a, b) => assert_eq!(a, b, "a run within budget {budget} differs with budget {}", budget * 4),
    }
    if let Err(Fault::Budget { .. }) = more {
        assert!(matches!(first, Err(Fault::Budget { .. })), "stopped by 4× the budget but not by the budget");
    }

    let prog = Arc::new(prog);
    let mut parser = BpfParser::new(prog.clone(), "fuzz");
    let want = match &first {
        Ok(r0) => parse_result(*r0 as u32),
        Err(f) => Parse::Invalid(ParseError::ProgramFault(f.to_string())),
    };
    assert_eq!(parser.parse(data), want);

    let limits = StreamLimits { max_msg_size: 4096, assembly_timeout: None, read_ahead: 0 };
    let mut sp = StreamParser::new(Box::new(Guarded(BpfParser::new(prog, "fuzz"))), limits);
    let (a, b) = data.split_at(data.len() / 3);
    for piece in [a, b] {
        sp.feed(piece);
        // Each message takes at least one byte: bounded by the data's length.
        for _ in 0..=data.len() {
            match sp.next_msg(Timestamp::ZERO) {
                Ok(Some(m)) => assert!(!m.is_empty() && m.len() <= 4096),
                Ok(None) | Err(_) => break,
            }
        }
    }
}

fuzz_target!(|input: &[u8]| {
    if input.len() < 4 {
        return;
    }
    // 1 ..= 65,536 instructions per run: loops end quickly.
    let budget = 1 + u64::from(input[1]) * 257;
    if input[0] & 1 == 1 {
        let object = &input[2..];
        let _ = Program::from_elf(object, None);
        let Ok(list) = elf::list_programs(object) else { return };
        for info in list.iter().take(8) {
            let functions = info.functions.iter().filter(|_| SELECT_BY_FUNCTION).map(String::as_str);
            let names = std::iter::once(info.section.as_str()).chain(functions);
            for name in names {
                if let Ok(p) = elf::load_program(object, Some(name)) {
                    if p.insns.len() <= MAX_INSNS {
                        exercise(&p.insns, budget, &[0x80, 0, 0, 0x28, 1, 2, 3, 4, 5, 6, 7, 8]);
                    }
                }
            }
        }
        return;
    }
    let n = (u16::from_le_bytes([input[2], input[3]]) as usize) % (MAX_INSNS + 1);
    let Some(code) = input.get(4..4 + 8 * n) else { return };
    let data = &input[4 + 8 * n..];
    let Ok(insns) = insn::decode(code) else { return };
    exercise(&insns, budget, data);
});
