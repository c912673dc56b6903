//! connmux-sys: the only `unsafe` in connmux. Each wrapper is small and carries a
//! `// SAFETY:` line. (Modules being implemented.)
pub mod bpf;
