//! Read parser programs out of the ELF objects `clang -target bpf -O2 -c` writes.
//!
//! A program is either a whole executable section (`SEC("socket_kcm")` in C) or
//! one function symbol inside one. Relocations (maps, global data, calls to
//! functions that were not inlined) are refused: a parser program has no use for
//! maps, and none of those would mean anything to this interpreter.

use object::{Object, ObjectSection, ObjectSymbol, SectionKind, SymbolKind};

use crate::insn::{decode, Insn};

/// Why an ELF object gave no program.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ElfError {
    #[error("not a readable ELF object: {0}")]
    Parse(String),
    #[error("not a BPF object (architecture {0})")]
    NotBpf(String),
    #[error("big-endian BPF object (bpfeb); build with -target bpf or bpfel on this machine")]
    BigEndian,
    #[error("no program section in the object")]
    NoProgram,
    #[error("several programs in the object, choose one by section or function name: {}", .0.join(", "))]
    Ambiguous(Vec<String>),
    #[error("no section or function named {name:?}; the object has: {}", .available.join(", "))]
    NotFound { name: String, available: Vec<String> },
    #[error("program {name:?} is {len} bytes, not whole 8-byte instructions")]
    BadSize { name: String, len: usize },
    #[error("program {name:?} has a relocation at instruction {insn} (to {target:?}): maps, global data and non-inlined calls are not supported")]
    Relocation { name: String, insn: usize, target: String },
}

/// A program found in an object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ElfProgram {
    /// The section it came from.
    pub section: String,
    /// The function's name, when the object names one at the program's start.
    pub function: Option<String>,
    pub insns: Vec<Insn>,
    /// The object's `license` section, if any (`BPF_PROG_LOAD` needs one).
    pub license: Option<String>,
}

/// One program an object offers: its section and the function symbols in it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProgramInfo {
    pub section: String,
    pub functions: Vec<String>,
    /// Instruction slots in the section.
    pub insns: usize,
}

fn parse(bytes: &[u8]) -> Result<object::File<'_>, ElfError> {
    let file = object::File::parse(bytes).map_err(|e| ElfError::Parse(e.to_string()))?;
    if file.architecture() != object::Architecture::Bpf {
        return Err(ElfError::NotBpf(format!("{:?}", file.architecture())));
    }
    if !file.is_little_endian() {
        return Err(ElfError::BigEndian);
    }
    Ok(file)
}

fn program_sections<'a>(file: &'a object::File<'a>) -> impl Iterator<Item = object::Section<'a, 'a>> + 'a {
    file.sections().filter(|s| s.kind() == SectionKind::Text && s.size() > 0)
}

/// The programs in an object (executable sections that are not empty).
pub fn list_programs(bytes: &[u8]) -> Result<Vec<ProgramInfo>, ElfError> {
    let file = parse(bytes)?;
    let mut out = Vec::new();
    for sec in program_sections(&file) {
        let functions = file
            .symbols()
            .filter(|sym| sym.kind() == SymbolKind::Text && sym.section_index() == Some(sec.index()))
            .filter_map(|sym| sym.name().ok().map(str::to_owned))
            .filter(|n| !n.is_empty())
            .collect();
        out.push(ProgramInfo {
            section: sec.name().unwrap_or("?").to_owned(),
            functions,
            insns: sec.size() as usize / 8,
        });
    }
    Ok(out)
}

/// Take one program from an object. `select` names a section or, failing that, a
/// function; without it the object must hold exactly one program section.
pub fn load_program(bytes: &[u8], select: Option<&str>) -> Result<ElfProgram, ElfError> {
    let file = parse(bytes)?;
    let names = || -> Vec<String> {
        program_sections(&file)
            .map(|s| s.name().unwrap_or("?").to_owned())
            .chain(
                file.symbols()
                    .filter(|s| s.kind() == SymbolKind::Text && s.size() > 0)
                    .filter_map(|s| s.name().ok().map(str::to_owned)),
            )
            .collect()
    };

    // (section, start, end) in bytes within the section.
    let (sec, start, end) = match select {
        None => {
            let secs: Vec<_> = program_sections(&file).collect();
            match secs.len() {
                0 => return Err(ElfError::NoProgram),
                1 => {
                    let s = secs.into_iter().next().expect("one");
                    let n = s.size();
                    (s, 0, n)
                }
                _ => return Err(ElfError::Ambiguous(names())),
            }
        }
        Some(name) => {
            if let Some(s) = program_sections(&file).find(|s| s.name() == Ok(name)) {
                let n = s.size();
                (s, 0, n)
            } else if let Some(sym) =
                file.symbols().find(|s| s.kind() == SymbolKind::Text && s.size() > 0 && s.name() == Ok(name))
            {
                let idx = sym.section_index().ok_or(ElfError::NoProgram)?;
                let s = file.section_by_index(idx).map_err(|e| ElfError::Parse(e.to_string()))?;
                // In a relocatable object a symbol's address is its offset in its section.
                let end = sym.address().checked_add(sym.size()).ok_or_else(|| {
                    ElfError::Parse(format!(
                        "symbol {name}: address {:#x} + size {:#x} overflows",
                        sym.address(),
                        sym.size()
                    ))
                })?;
                (s, sym.address(), end)
            } else {
                return Err(ElfError::NotFound { name: name.to_owned(), available: names() });
            }
        }
    };

    let section = sec.name().unwrap_or("?").to_owned();
    let data = sec.data().map_err(|e| ElfError::Parse(e.to_string()))?;
    let code = data
        .get(start as usize..end as usize)
        .ok_or_else(|| ElfError::Parse(format!("function outside section {section}")))?;
    let label = || match select {
        Some(n) => n.to_owned(),
        None => section.clone(),
    };
    let insns = decode(code).map_err(|_| ElfError::BadSize { name: label(), len: code.len() })?;

    for (off, rel) in sec.relocations() {
        if off >= start && off < end {
            let target = match rel.target() {
                object::RelocationTarget::Symbol(i) => match file.symbol_by_index(i) {
                    // A section symbol (global data) has no name of its own.
                    Ok(sym) => match sym.name() {
                        Ok(n) if !n.is_empty() => n.to_owned(),
                        _ => sym
                            .section_index()
                            .and_then(|i| file.section_by_index(i).ok())
                            .and_then(|s| s.name().ok().map(str::to_owned))
                            .unwrap_or_else(|| format!("symbol {}", i.0)),
                    },
                    Err(_) => format!("symbol {}", i.0),
                },
                other => format!("{other:?}"),
            };
            return Err(ElfError::Relocation { name: label(), insn: ((off - start) / 8) as usize, target });
        }
    }

    let function = file
        .symbols()
        .find(|s| s.kind() == SymbolKind::Text && s.section_index() == Some(sec.index()) && s.address() == start)
        .and_then(|s| s.name().ok().map(str::to_owned))
        .filter(|n| !n.is_empty());

    let license = file.section_by_name("license").and_then(|s| s.data().ok()).map(|d| {
        let end = d.iter().position(|&b| b == 0).unwrap_or(d.len());
        String::from_utf8_lossy(&d[..end]).into_owned()
    });

    Ok(ElfProgram { section, function, insns, license })
}
