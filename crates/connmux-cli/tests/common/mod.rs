//! What the tests that run the `connmux` binary as a server share.

#![allow(dead_code)] // each test file uses its part

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};

pub const BIN: &str = env!("CARGO_BIN_EXE_connmux");

/// A `connmux` server process, killed when dropped.
pub struct Server {
    pub child: Child,
    pub addr: SocketAddr,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Spawn `cmd` (a `connmux` server listening on port 0) and read the address
/// it listens on from its first line ("... listening on ADDR ...").
pub fn spawn_server(cmd: &mut Command) -> Server {
    let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::inherit()).spawn().expect("spawn connmux");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let addr = line
        .split_whitespace()
        .find_map(|w| w.parse::<SocketAddr>().ok())
        .unwrap_or_else(|| panic!("no address in {line:?}"));
    Server { child, addr }
}
