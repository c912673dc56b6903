//! A load generator's connection: plain TCP, or rustls over the same blocking
//! socket (`--tls`). The engine sees the same four calls either way.
//!
//! With TLS, the handshake is done at connect, before the round's clock
//! starts, so a round measures requests and replies, not handshakes. A send
//! hands every request to rustls and writes the records at once (blocking, up
//! to the I/O timeout): a request left inside rustls would never be answered,
//! and the engine only waits for replies to requests it counts as sent.

use std::io::{self, ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use connmux::tls::rustls;

use crate::cmd::tls::ClientSetup;

pub struct Conn {
    s: TcpStream,
    tls: Option<Box<rustls::ClientConnection>>,
}

fn invalid(e: rustls::Error) -> io::Error {
    io::Error::new(ErrorKind::InvalidData, e)
}

impl Conn {
    pub fn plain(s: TcpStream) -> Conn {
        Conn { s, tls: None }
    }

    /// TLS over `s` (blocking, with its timeouts): handshake done within `timeout`.
    pub fn tls(s: TcpStream, setup: &ClientSetup, timeout: Duration) -> Result<Conn, String> {
        let mut c =
            rustls::ClientConnection::new(setup.config.clone(), setup.name.clone()).map_err(|e| format!("TLS: {e}"))?;
        let end = Instant::now() + timeout;
        let mut sock = &s;
        // Bounded: each round moves handshake bytes or fails on the socket's timeout.
        for _ in 0..64 {
            if !c.is_handshaking() {
                break;
            }
            if Instant::now() > end {
                return Err("TLS handshake: timed out".into());
            }
            c.complete_io(&mut sock).map_err(|e| format!("TLS handshake: {e}"))?;
        }
        if c.is_handshaking() {
            return Err("TLS handshake did not complete".into());
        }
        Ok(Conn { s, tls: Some(Box::new(c)) })
    }

    /// Send what the socket takes now (plain), or all of it (TLS, see above).
    pub fn send_nowait(&mut self, data: &[u8]) -> io::Result<usize> {
        match &mut self.tls {
            None => socket2::SockRef::from(&self.s).send_with_flags(data, libc::MSG_DONTWAIT),
            Some(_) => self.write_all_tls(data).map(|()| data.len()),
        }
    }

    /// A blocking send (the socket's write timeout applies).
    pub fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        match &mut self.tls {
            None => (&self.s).write(data),
            Some(_) => self.write_all_tls(data).map(|()| data.len()),
        }
    }

    fn write_all_tls(&mut self, mut data: &[u8]) -> io::Result<()> {
        let c = self.tls.as_mut().expect("TLS connection");
        // Bounded: each round takes bytes into records (rustls's buffer is
        // emptied below) or fails.
        while !data.is_empty() {
            let n = c.writer().write(data)?;
            data = &data[n..];
            while c.wants_write() {
                c.write_tls(&mut &self.s)?;
            }
            if n == 0 {
                return Err(io::Error::new(ErrorKind::WriteZero, "TLS writer takes nothing"));
            }
        }
        Ok(())
    }

    /// Read plaintext: blocking, or WouldBlock in non-blocking mode. 0 at the end.
    pub fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let Some(c) = self.tls.as_mut() else { return (&self.s).read(buf) };
        // Bounded: each round reads records from the socket or returns.
        for _ in 0..1024 {
            match c.reader().read(buf) {
                Ok(n) => return Ok(n),
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == ErrorKind::UnexpectedEof => return Ok(0),
                Err(e) => return Err(e),
            }
            if c.read_tls(&mut &self.s)? == 0 {
                return Ok(0);
            }
            c.process_new_packets().map_err(invalid)?;
            // Session tickets need no answer; key updates do.
            while c.wants_write() {
                match c.write_tls(&mut &self.s) {
                    Ok(_) => {}
                    Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                    Err(e) => return Err(e),
                }
            }
        }
        Err(io::Error::new(ErrorKind::WouldBlock, "no plaintext after many records"))
    }

    pub fn set_nonblocking(&self, nb: bool) -> io::Result<()> {
        self.s.set_nonblocking(nb)
    }
}
