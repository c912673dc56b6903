//! Built-in parsers (being implemented).
