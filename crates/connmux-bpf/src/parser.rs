//! [`BpfParser`]: a KCM parser program behind the core [`Parser`] trait.

use std::path::Path;
use std::sync::Arc;

use connmux_core::{Parse, ParseError, Parser};

use crate::{elf, Insn, LoadError, Program, Vm};

/// A BPF parser program for one psock. The checked program is shared
/// ([`Arc`]); each parser has its own stack and context scratch, so parsing
/// allocates nothing.
///
/// The program sees the current message from its first byte, with every byte
/// gathered so far (`skb->len`), and its return value, read as a 32-bit int as
/// KCM does, becomes:
/// - `> 0`: [`Parse::Length`], the whole message's length;
/// - `0`: [`Parse::NeedMore(1)`](Parse::NeedMore) (a program cannot say how many);
/// - `< 0`: [`Parse::Invalid`] with [`ParseError::Program`]`(-ret)`, the errno KCM
///   would post on the TCP socket;
/// - a run stopped by the budget or a bad memory access:
///   [`ParseError::ProgramFault`].
#[derive(Debug)]
pub struct BpfParser {
    program: Arc<Program>,
    vm: Vm,
    name: String,
}

impl Clone for BpfParser {
    fn clone(&self) -> Self {
        BpfParser::new(self.program.clone(), &self.name["bpf:".len()..])
    }
}

impl BpfParser {
    /// A parser running `program`; `name` is shown as `bpf:<name>`.
    pub fn new(program: Arc<Program>, name: &str) -> BpfParser {
        BpfParser { program, vm: Vm::new(), name: format!("bpf:{name}") }
    }

    /// From raw bytecode: 8-byte instructions as the kernel takes them.
    pub fn from_raw(code: &[u8]) -> Result<BpfParser, LoadError> {
        let prog = Program::new(&crate::insn::decode(code)?)?;
        Ok(BpfParser::new(Arc::new(prog), "raw"))
    }

    /// From an ELF object made by `clang -target bpf -O2 -c`; `section` names the
    /// program's section or function (needed when the object has several).
    pub fn from_elf_bytes(bytes: &[u8], section: Option<&str>) -> Result<BpfParser, LoadError> {
        let p = elf::load_program(bytes, section)?;
        let prog = Program::new(&p.insns)?;
        let name = p.function.as_deref().unwrap_or(&p.section).to_owned();
        Ok(BpfParser::new(Arc::new(prog), &name))
    }

    /// [`from_elf_bytes`](Self::from_elf_bytes) on a file's contents, read by
    /// [`read_object`](crate::read_object): the ELF magic first, then at most
    /// [`MAX_OBJECT_SIZE`](crate::MAX_OBJECT_SIZE) bytes.
    pub fn from_elf_file(path: impl AsRef<Path>, section: Option<&str>) -> Result<BpfParser, LoadError> {
        let bytes = crate::read_object(path.as_ref())?;
        BpfParser::from_elf_bytes(&bytes, section)
    }

    pub fn program(&self) -> &Arc<Program> {
        &self.program
    }

    /// The loaded instructions (to hand to the kernel's `BPF_PROG_LOAD`).
    pub fn insns(&self) -> &[Insn] {
        self.program.insns()
    }
}

/// Map a socket filter's 32-bit result onto the parser's answer.
pub fn parse_result(ret: u32) -> Parse {
    let v = ret as i32;
    if v > 0 {
        Parse::Length(v as usize)
    } else if v == 0 {
        Parse::NeedMore(1)
    } else {
        // i32::MIN has no positive counterpart; it stays as it is.
        Parse::Invalid(ParseError::Program(v.wrapping_neg()))
    }
}

impl Parser for BpfParser {
    // Stateless: the same bytes always get the same answer.
    fn frames_in_place(&self) -> bool {
        true
    }

    fn parse(&mut self, buf: &[u8]) -> Parse {
        match self.program.run(&mut self.vm, buf) {
            Ok(r0) => parse_result(r0 as u32),
            Err(fault) => Parse::Invalid(ParseError::ProgramFault(fault.to_string())),
        }
    }

    fn name(&self) -> &str {
        &self.name
    }
}
