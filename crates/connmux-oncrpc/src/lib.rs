//! connmux-oncrpc (being implemented).
#![forbid(unsafe_code)]
