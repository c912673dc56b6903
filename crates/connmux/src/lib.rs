//! connmux runtime (being implemented).
