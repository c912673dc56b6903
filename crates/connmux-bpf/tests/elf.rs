//! Loading programs from `clang -target bpf` objects: choosing by section or
//! function, refusing what cannot run here, with a typed error each.

mod common;

use std::path::PathBuf;
use std::process::Command;

use common::{objects_dir, repo_root};
use connmux_bpf::elf::{list_programs, load_program};
use connmux_bpf::{BpfParser, ElfError, LoadError};
use connmux_core::{Parse, Parser};

fn object(name: &str) -> Vec<u8> {
    std::fs::read(objects_dir().join(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// Compile a C snippet for BPF into the test scratch folder.
fn compile(name: &str, c: &str) -> Vec<u8> {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("elf-tests");
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join(format!("{name}.c"));
    let obj = dir.join(format!("{name}.o"));
    std::fs::write(&src, c).unwrap();
    let out = Command::new("clang")
        .args(["-target", "bpf", "-O2", "-c", "-I"])
        .arg(repo_root().join("bpf"))
        .arg(&src)
        .arg("-o")
        .arg(&obj)
        .output()
        .expect("clang is required (Debian/Ubuntu: apt-get install clang)");
    assert!(out.status.success(), "clang: {}", String::from_utf8_lossy(&out.stderr));
    std::fs::read(&obj).unwrap()
}

#[test]
fn single_program_object_needs_no_name() {
    let bytes = object("len_prefix.v3.o");
    let p = load_program(&bytes, None).unwrap();
    assert_eq!(p.section, "socket_kcm");
    assert_eq!(p.function.as_deref(), Some("len_prefix"));
    assert_eq!(p.license.as_deref(), Some("GPL"));
    let mut parser = BpfParser::from_elf_bytes(&bytes, None).unwrap();
    assert_eq!(parser.name(), "bpf:len_prefix");
    assert_eq!(parser.parse(&[0, 0, 0, 6, 1]), Parse::Length(10));
    assert_eq!(parser.parse(&[0, 0, 6]), Parse::NeedMore(1));
    // By section or by function name: the same program.
    assert_eq!(load_program(&bytes, Some("socket_kcm")).unwrap().insns, p.insns);
    assert_eq!(load_program(&bytes, Some("len_prefix")).unwrap().insns, p.insns);
}

#[test]
fn several_programs_choose_by_section_or_function() {
    let bytes = object("len_variants.v3.o");
    let listed = list_programs(&bytes).unwrap();
    let sections: Vec<&str> = listed.iter().map(|p| p.section.as_str()).collect();
    assert_eq!(sections, ["socket/len16le", "socket/magic_len32le", "socket/len64be"]);
    assert_eq!(listed[1].functions, ["magic_len32le"]);
    match load_program(&bytes, None) {
        Err(ElfError::Ambiguous(names)) => {
            assert!(
                names.contains(&"socket/len64be".to_string()) && names.contains(&"len16le".to_string()),
                "{names:?}"
            )
        }
        other => panic!("{other:?}"),
    }
    let by_section = load_program(&bytes, Some("socket/len64be")).unwrap();
    let by_function = load_program(&bytes, Some("len64be")).unwrap();
    assert_eq!(by_section.insns, by_function.insns);
    assert_eq!(by_function.section, "socket/len64be");
    let mut p = BpfParser::from_elf_bytes(&bytes, Some("len16le")).unwrap();
    assert_eq!(p.parse(&[5, 0, 0, 0, 0]), Parse::Length(5));
    match load_program(&bytes, Some("nope")) {
        Err(ElfError::NotFound { name, available }) => {
            assert_eq!(name, "nope");
            assert!(available.contains(&"magic_len32le".to_string()));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn functions_sharing_a_section() {
    // Two programs in one section: only a function name picks one.
    let bytes = compile(
        "two_in_text",
        r#"#include "connmux_bpf.h"
        __attribute__((noinline)) int first(struct __sk_buff *skb) { return load_byte(skb, 0) + 1; }
        int second(struct __sk_buff *skb) { return 7; }
        "#,
    );
    let mut a = BpfParser::from_elf_bytes(&bytes, Some("first")).unwrap();
    let mut b = BpfParser::from_elf_bytes(&bytes, Some("second")).unwrap();
    assert_eq!(a.parse(&[4]), Parse::Length(5));
    assert_eq!(b.parse(&[4]), Parse::Length(7));
}

#[test]
fn refusals() {
    // Global data needs a relocation (a map of the .bss/.data section).
    let bytes = compile(
        "global",
        r#"#include "connmux_bpf.h"
        static volatile __u32 seen;
        SEC("socket_kcm") int counting(struct __sk_buff *skb) { seen++; return 4; }
        "#,
    );
    match load_program(&bytes, None) {
        Err(ElfError::Relocation { name, insn, target }) => {
            assert_eq!(name, "socket_kcm");
            assert_eq!(insn, 0);
            assert_eq!(target, ".bss");
        }
        other => panic!("{other:?}"),
    }
    // A helper this interpreter does not provide is refused by the checker.
    let bytes = compile(
        "random",
        r#"#include "connmux_bpf.h"
        static __u32 (*bpf_get_prandom_u32)(void) = (void *)7;
        SEC("socket_kcm") int rnd(struct __sk_buff *skb) { return bpf_get_prandom_u32() & 0xff; }
        "#,
    );
    match BpfParser::from_elf_bytes(&bytes, None) {
        Err(LoadError::Check(connmux_bpf::CheckError::UnknownHelper { id: 7, .. })) => {}
        other => panic!("{other:?}"),
    }
    // Not a BPF object: this test binary.
    let me = std::fs::read(std::env::current_exe().unwrap()).unwrap();
    assert!(matches!(load_program(&me, None), Err(ElfError::NotBpf(_))));
    assert!(matches!(load_program(b"not an object", None), Err(ElfError::Parse(_))));
    let missing = BpfParser::from_elf_file("/nonexistent/x.o", None).unwrap_err();
    assert!(matches!(missing, LoadError::Io { .. }), "{missing:?}");
}

#[test]
fn big_endian_objects_are_refused() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("elf-tests");
    std::fs::create_dir_all(&dir).unwrap();
    let src = repo_root().join("bpf/len_prefix.c");
    let obj = dir.join("len_prefix.bpfeb.o");
    let ok = Command::new("clang")
        .args(["-target", "bpfeb", "-O2", "-c"])
        .arg(&src)
        .arg("-o")
        .arg(&obj)
        .status()
        .expect("clang is required (Debian/Ubuntu: apt-get install clang)");
    assert!(ok.success());
    let bytes = std::fs::read(&obj).unwrap();
    assert_eq!(load_program(&bytes, None).unwrap_err(), ElfError::BigEndian);
}
