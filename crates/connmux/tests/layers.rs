//! The runtime's module graph has no cycle and points down one layer list.
//!
//! Reads `src/**/*.rs`; each top-level module (a file, or a folder with all
//! its files) is one node. An edge is a `crate::x` path (in a `use`, braced
//! `use crate::{x, y}` included, or written inline), a `super::x` that leaves
//! a top-level module, or `crate::Name` for a name `lib.rs` re-exports from
//! module `x`. Comments are skipped: a doc link is not a dependency.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Bottom first. A module may name only modules on lines above its own.
const LAYERS: &[&[&str]] = &[
    &["sync", "config"],
    &["handler"],
    &["shared"],
    &["events"],
    &["kernel"],
    &["lane"],
    &["serve"],
    &["driver"],
    &["lead"],
    &["mux"],
    &["alone"],
    &["socket"],
    &["async_socket"],
    &["tls"],
    &["service"],
    &["udp"],
];

fn rs_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir).expect("read src").map(|e| e.unwrap().path()).collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            rs_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

/// The text without `//` and `/* */` comments, string literals kept.
fn strip_comments(src: &str) -> String {
    let b = src.as_bytes();
    let mut out = String::with_capacity(src.len());
    let mut i = 0;
    let mut in_str = false;
    while i < b.len() {
        let c = b[i];
        if in_str {
            if c == b'\\' && i + 1 < b.len() {
                out.push(' ');
                out.push(' ');
                i += 2;
                continue;
            }
            if c == b'"' {
                in_str = false;
            }
            out.push(' ');
            i += 1;
            continue;
        }
        if c == b'"' && !(i > 0 && b[i - 1] == b'\'' && i + 1 < b.len() && b[i + 1] == b'\'') {
            in_str = true;
            out.push(' ');
            i += 1;
        } else if c == b'/' && b.get(i + 1) == Some(&b'/') {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if c == b'/' && b.get(i + 1) == Some(&b'*') {
            let mut depth = 0;
            while i < b.len() {
                if b[i] == b'/' && b.get(i + 1) == Some(&b'*') {
                    depth += 1;
                    i += 2;
                } else if b[i] == b'*' && b.get(i + 1) == Some(&b'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else {
            out.push(c as char);
            i += 1;
        }
    }
    out
}

fn ident_at(s: &str) -> &str {
    let end = s.find(|c: char| !(c.is_alphanumeric() || c == '_')).unwrap_or(s.len());
    &s[..end]
}

/// The first identifier of each path after `prefix::` in `text`, braced
/// groups opened one level (`crate::{a, b::c}` gives `a`, `b`).
fn names_after(text: &str, prefix: &str) -> Vec<String> {
    let mut out = Vec::new();
    let pat = format!("{prefix}::");
    let mut from = 0;
    while let Some(at) = text[from..].find(&pat) {
        let start = from + at;
        from = start + pat.len();
        let before = text[..start].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
            continue;
        }
        let rest = text[from..].trim_start();
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 0;
            let mut item = String::new();
            let mut items = Vec::new();
            for c in group.chars() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => items.push(std::mem::take(&mut item)),
                    _ if depth == 0 => item.push(c),
                    _ => {}
                }
            }
            items.push(item);
            for it in items {
                let name = ident_at(it.trim());
                if !name.is_empty() {
                    out.push(name.to_string());
                }
            }
        } else {
            let name = ident_at(rest);
            if !name.is_empty() {
                out.push(name.to_string());
            }
        }
    }
    out
}

struct Graph {
    modules: BTreeSet<String>,
    /// from → (to → a file that names it)
    edges: BTreeMap<String, BTreeMap<String, String>>,
}

fn graph() -> Graph {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let lib = strip_comments(&std::fs::read_to_string(src.join("lib.rs")).expect("lib.rs"));
    let mut modules = BTreeSet::new();
    for line in lib.lines() {
        let l = line.trim();
        let l = l.strip_prefix("pub ").unwrap_or(l);
        if let Some(rest) = l.strip_prefix("mod ") {
            modules.insert(ident_at(rest).to_string());
        }
    }
    // `pub use x::{A, B}` in lib.rs: `crate::A` is module `x`.
    let mut reexports = BTreeMap::new();
    for stmt in lib.split(';') {
        let s = stmt.trim();
        let Some(rest) = s.strip_prefix("pub use ") else { continue };
        let rest = rest.trim_start_matches("crate::");
        let m = ident_at(rest);
        if !modules.contains(m) {
            continue;
        }
        let tail = &rest[m.len()..];
        let names: Vec<&str> = match tail.find('{') {
            Some(o) => tail[o + 1..].trim_end_matches('}').split(',').collect(),
            None => vec![tail.rsplit("::").next().unwrap_or("")],
        };
        for n in names {
            let n = n.trim();
            let n = n.rsplit(" as ").next().unwrap_or(n).rsplit("::").next().unwrap_or(n).trim();
            if !n.is_empty() {
                reexports.insert(n.to_string(), m.to_string());
            }
        }
    }
    let mut files = Vec::new();
    rs_files(&src, &mut files);
    let mut edges: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    for f in files {
        let rel = f.strip_prefix(&src).unwrap();
        let parts: Vec<String> = rel.iter().map(|p| p.to_string_lossy().trim_end_matches(".rs").to_string()).collect();
        if parts.len() == 1 && parts[0] == "lib" {
            continue;
        }
        let node = parts[0].clone();
        assert!(modules.contains(&node), "{} is not declared in lib.rs", rel.display());
        // This file's depth below the crate root: `a.rs` and `a/mod.rs` are 1.
        let depth = if parts.last().is_some_and(|p| p == "mod") { parts.len() - 1 } else { parts.len() };
        let text = strip_comments(&std::fs::read_to_string(&f).unwrap());
        let mut named: Vec<String> = Vec::new();
        for n in names_after(&text, "crate") {
            if modules.contains(&n) {
                named.push(n);
            } else if let Some(m) = reexports.get(&n) {
                named.push(m.clone());
            }
        }
        // `super::x` leaves the top-level module only from its top file.
        if depth == 1 {
            named.extend(names_after(&text, "super").into_iter().filter(|n| modules.contains(n) && *n != node));
        }
        for to in named {
            if to != node {
                edges.entry(node.clone()).or_default().entry(to).or_insert_with(|| rel.display().to_string());
            }
        }
    }
    Graph { modules, edges }
}

fn find_cycle(g: &Graph) -> Option<Vec<String>> {
    // 0 unseen, 1 on the stack, 2 done.
    fn visit(g: &Graph, n: &str, state: &mut BTreeMap<String, u8>, stack: &mut Vec<String>) -> Option<Vec<String>> {
        state.insert(n.to_string(), 1);
        stack.push(n.to_string());
        for to in g.edges.get(n).into_iter().flat_map(|m| m.keys()) {
            match state.get(to).copied().unwrap_or(0) {
                1 => {
                    let at = stack.iter().position(|s| s == to).unwrap();
                    let mut cycle = stack[at..].to_vec();
                    cycle.push(to.clone());
                    return Some(cycle);
                }
                0 => {
                    if let Some(c) = visit(g, to, state, stack) {
                        return Some(c);
                    }
                }
                _ => {}
            }
        }
        stack.pop();
        state.insert(n.to_string(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for m in &g.modules {
        if state.get(m).copied().unwrap_or(0) == 0 {
            let mut stack = Vec::new();
            if let Some(c) = visit(g, m, &mut state, &mut stack) {
                return Some(c);
            }
        }
    }
    None
}

#[test]
fn the_parser_of_this_test_sees_paths() {
    let t =
        strip_comments("use crate::{a, b::{c, d}};\n// crate::x\nlet s = \"crate::y\"; crate::z::f(); super::w::g;");
    assert_eq!(names_after(&t, "crate"), ["a", "b", "z"]);
    assert_eq!(names_after(&t, "super"), ["w"]);
}

#[test]
fn module_graph_has_no_cycle() {
    let g = graph();
    assert!(g.modules.len() >= 8, "modules found: {:?}", g.modules);
    if let Some(cycle) = find_cycle(&g) {
        let hops: Vec<String> =
            cycle.windows(2).map(|w| format!("{} -> {} (in {})", w[0], w[1], g.edges[&w[0]][&w[1]])).collect();
        panic!("module cycle: {}\n  {}", cycle.join(" -> "), hops.join("\n  "));
    }
}

#[test]
fn every_edge_points_down_the_layer_list() {
    let g = graph();
    let mut layer = BTreeMap::new();
    for (i, l) in LAYERS.iter().enumerate() {
        for m in l.iter() {
            assert!(layer.insert(m.to_string(), i).is_none(), "{m} listed twice");
        }
    }
    let unlisted: Vec<&String> = g.modules.iter().filter(|m| !layer.contains_key(*m)).collect();
    assert!(unlisted.is_empty(), "modules not in LAYERS: {unlisted:?}");
    let gone: Vec<&String> = layer.keys().filter(|m| !g.modules.contains(*m)).collect();
    assert!(gone.is_empty(), "LAYERS names modules that do not exist: {gone:?}");
    let mut bad = Vec::new();
    for (from, tos) in &g.edges {
        for (to, file) in tos {
            if layer[to] >= layer[from] {
                bad.push(format!("{from} (layer {}) -> {to} (layer {}) in {file}", layer[from], layer[to]));
            }
        }
    }
    assert!(bad.is_empty(), "edges that do not point down:\n  {}", bad.join("\n  "));
}
