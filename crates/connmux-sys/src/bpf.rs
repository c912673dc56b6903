//! bpf(2) wrappers (being implemented).
