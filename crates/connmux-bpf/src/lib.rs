//! connmux-bpf: run KCM's BPF parser programs in user space, safely, with the
//! kernel's answers.
//!
//! KCM frames a TCP stream with a `BPF_PROG_TYPE_SOCKET_FILTER` program that
//! returns the current message's length (> 0), 0 for "need more bytes", or a
//! negative errno. This crate loads such programs (raw bytecode, or ELF objects
//! from `clang -target bpf -O2 -c`), checks them at load ([`CheckError`]), and
//! interprets them with a per-run instruction budget ([`Fault`]).
//! [`BpfParser`] puts one behind `connmux_core::Parser`.
//!
//! ```text
//! bytes of the message so far ──► Program::run(Vm, data) ──► R0 ──► Parse
//!                                    │ LD_ABS/LD_IND, bpf_skb_load_bytes read data
//!                                    │ skb->len = data.len()
//! ```
//!
//! # Semantics (as the kernel, checked against `BPF_PROG_TEST_RUN`)
//! - The data the program sees begins at the **message's first byte** (KCM gives
//!   the program the TCP segment's skb, so messages not at a segment start are
//!   mis-framed there; here they are not) and `skb->len` is every byte gathered.
//! - `LD_ABS`/`LD_IND` read 1, 2 or 4 bytes in network byte order; the offset is
//!   a 32-bit int (`LD_IND`: `src + imm`, truncated); a read past the end ends the
//!   program with 0 ("need more"), as the kernel's rewrite of these loads does.
//!   They leave r1–r5 unreadable, as calls do.
//! - `bpf_skb_load_bytes` (helper 26) copies into the stack, or clears the
//!   destination and returns `-EFAULT` (-14) when the bytes are not all there.
//! - 64- and 32-bit ALU (32-bit results zero-extended), `JMP` and `JMP32`, the
//!   BPF v4 additions (sign-extending moves and loads, signed division and
//!   modulo, `bswap`, `gotol`), `END` byte swaps, stack loads and stores, and
//!   atomics on the stack.
//! - Division by zero gives 0; modulo by zero leaves the dividend (its low 32
//!   bits for 32-bit operations); signed division of the minimum by -1 wraps.
//!   These are the kernel's rewrites. Division by a constant 0 is refused at load.
//! - Shifts by a register use the amount modulo the width, as the x86-64 and
//!   arm64 JITs do; shifts by an out-of-range constant are refused at load.
//! - The context is `struct __sk_buff`: `len` can be read (narrow reads too),
//!   `cb[0..5]` read and written (zero at the start of every run).
//!
//! # Departures from the kernel
//! - The checker is not the kernel's verifier. It refuses what it can see
//!   statically (unknown or malformed instructions, bad registers, jumps out of
//!   range, fixed stack offsets out of bounds or misaligned, helpers other than
//!   `bpf_skb_load_bytes`, BPF-to-BPF and kfunc calls, map references, registers
//!   read before written, unreachable code, falling off the end). What the kernel
//!   proves with pointer and range tracking is checked at run time here instead:
//!   a computed address outside the stack or the context, a context field other
//!   than `len`/`cb`, or a bad helper argument stops the run with a [`Fault`]. So
//!   some programs the kernel refuses are accepted here and fault (or run) here;
//!   every program the kernel accepts behaves the same in both.
//! - Loops need no proof of termination: the instruction budget
//!   ([`Limits::budget`]) stops a run that goes on too long.
//! - The stack bytes a program can reach are zero at the start of each run (the
//!   kernel leaves them undefined; reading them before writing is refused there).
//! - `LD_ABS`/`LD_IND` at a negative offset (the kernel's `SKF_NET_OFF` and
//!   `SKF_LL_OFF` areas, which under KCM would read the segment's IP and MAC
//!   headers) read nothing and end the program with 0.
//! - `LD_ABS`/`LD_IND` do not require the context in r6 (the message is implicit),
//!   only that r6 was written.
//!
//! # What it does not do
//! Maps, tail calls, helpers other than `bpf_skb_load_bytes`, BPF-to-BPF calls,
//! global data, BTF, JIT compilation, big-endian objects, program types other
//! than socket filters, and loading anything into the kernel (that is
//! `connmux_sys::bpf`).
#![forbid(unsafe_code)]

pub mod asm;
pub mod check;
pub mod elf;
pub mod insn;
mod parser;
mod vm;

use std::path::PathBuf;

pub use check::{CheckError, Limits, STACK_SIZE};
pub use elf::{ElfError, ElfProgram, ProgramInfo};
pub use insn::Insn;
pub use parser::{parse_result, BpfParser};
pub use vm::{Fault, Program, Vm};

/// Why a program could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("{len} bytes of bytecode is not a whole number of 8-byte instructions")]
    NotWholeInstructions { len: usize },
    #[error(transparent)]
    Elf(#[from] ElfError),
    // The reason is in the message, so it is not also a `source`: a report
    // that prints the chain says it once.
    #[error("program refused: {0}")]
    Check(CheckError),
    /// The file could not be read; the OS error is the `source` (not repeated
    /// in the message).
    #[error("reading {path}")]
    Io { path: PathBuf, source: std::io::Error },
    /// The file does not start with the ELF magic (`\x7fELF`).
    #[error("{path} is not an ELF object (it does not start with \\x7fELF)")]
    NotElf { path: PathBuf },
    /// The file is larger than [`MAX_OBJECT_SIZE`].
    #[error("{path} is larger than {max} bytes, the most an object may be")]
    TooLarge { path: PathBuf, max: usize },
}

impl From<CheckError> for LoadError {
    fn from(e: CheckError) -> LoadError {
        LoadError::Check(e)
    }
}

/// The largest ELF object [`BpfParser::from_elf_file`] reads: a program has at
/// most [`Limits::max_insns`] (65,536) instructions, 512 KiB of code, and the
/// rest of a `clang -g` object (BTF, DWARF, symbols) is a few times that;
/// 16 MiB leaves room and bounds the memory a bad path (a device, a pipe, a
/// huge file) can cost.
pub const MAX_OBJECT_SIZE: usize = 16 << 20;

/// Read an ELF object file: the magic is checked on the first bytes, and at
/// most [`MAX_OBJECT_SIZE`] bytes are read, so an endless or random input
/// (`/dev/urandom`) is refused at once.
pub fn read_object(path: &std::path::Path) -> Result<Vec<u8>, LoadError> {
    use std::io::Read;
    let io = |source| LoadError::Io { path: path.to_owned(), source };
    let mut f = std::fs::File::open(path).map_err(io)?;
    let mut magic = [0u8; 4];
    let mut got = 0;
    // Bounded: each turn reads at least one byte or returns.
    while got < magic.len() {
        match f.read(&mut magic[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(io(e)),
        }
    }
    if magic[..got] != b"\x7fELF"[..] {
        return Err(LoadError::NotElf { path: path.to_owned() });
    }
    let mut bytes = magic.to_vec();
    f.take(MAX_OBJECT_SIZE as u64 + 1 - 4).read_to_end(&mut bytes).map_err(io)?;
    if bytes.len() > MAX_OBJECT_SIZE {
        return Err(LoadError::TooLarge { path: path.to_owned(), max: MAX_OBJECT_SIZE });
    }
    Ok(bytes)
}

impl Program {
    /// Decode and check raw bytecode.
    pub fn from_bytes(code: &[u8]) -> Result<Program, LoadError> {
        Ok(Program::new(&insn::decode(code)?)?)
    }

    /// Take one program out of an ELF object (see [`elf::load_program`]) and check it.
    pub fn from_elf(bytes: &[u8], select: Option<&str>) -> Result<Program, LoadError> {
        Ok(Program::new(&elf::load_program(bytes, select)?.insns)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The message and its sources, as `anyhow`'s `{:#}` prints them.
    fn chain(e: &dyn std::error::Error) -> String {
        let mut s = e.to_string();
        let mut cur = e.source();
        while let Some(c) = cur {
            s.push_str(": ");
            s.push_str(&c.to_string());
            cur = c.source();
        }
        s
    }

    #[test]
    fn load_errors_say_their_reason_once() {
        let e = Program::from_bytes(&[0x52, 0, 0, 0, 0, 0, 0, 0]).unwrap_err();
        let text = chain(&e);
        assert_eq!(text.matches("unknown opcode 0x52").count(), 1, "{text}");
        let e = read_object(std::path::Path::new("/nonexistent/connmux.o")).unwrap_err();
        let text = chain(&e);
        assert_eq!(text.matches("No such file or directory").count(), 1, "{text}");
        assert!(text.contains("/nonexistent/connmux.o"), "{text}");
    }

    #[test]
    fn read_object_checks_the_magic_before_reading_on() {
        // An endless device: refused on its first bytes.
        let e = read_object(std::path::Path::new("/dev/zero")).unwrap_err();
        assert!(matches!(e, LoadError::NotElf { .. }), "{e}");
        let e = read_object(std::path::Path::new("/dev/null")).unwrap_err();
        assert!(matches!(e, LoadError::NotElf { .. }), "{e}");
    }
}
