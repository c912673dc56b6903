//! The per-psock stream parser (being implemented).
