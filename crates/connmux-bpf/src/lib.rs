//! connmux-bpf (being implemented).
#![forbid(unsafe_code)]
