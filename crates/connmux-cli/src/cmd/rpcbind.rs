//! Registration with the local rpcbind (portmapper version 2, RFC 1833 §3),
//! so that clients which ask rpcbind for the port (`rpcinfo -t HOST PROG VERS`,
//! NFS clients) find the RPC server. A server registers every version of every
//! program it serves for TCP (and UDP, when it answers there too) on start and
//! withdraws them when it stops.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use anyhow::{bail, Context};
use connmux_oncrpc::reply::{decode_reply, Reply};

const PMAP_PROG: u32 = 100_000;
const PMAP_VERS: u32 = 2;
const PMAPPROC_SET: u32 = 1;
const PMAPPROC_UNSET: u32 = 2;
const IPPROTO_TCP: u32 = 6;
const IPPROTO_UDP: u32 = 17;

/// One call to rpcbind: `proc` with the mapping (prog, vers, protocol, port).
fn call(rpcbind: SocketAddr, xid: u32, proc_: u32, map: (u32, u32, u32), port: u16) -> anyhow::Result<bool> {
    let (prog, vers, prot) = map;
    let mut body = Vec::with_capacity(56);
    // xid, CALL, RPC version 2, program, version, procedure, AUTH_NONE
    // credential and verifier, then the mapping.
    for w in [xid, 0, 2, PMAP_PROG, PMAP_VERS, proc_, 0, 0, 0, 0, prog, vers, prot, port as u32] {
        body.extend_from_slice(&w.to_be_bytes());
    }
    let mut wire = (0x8000_0000u32 | body.len() as u32).to_be_bytes().to_vec();
    wire.extend_from_slice(&body);
    let mut c = TcpStream::connect_timeout(&rpcbind, Duration::from_secs(2))
        .with_context(|| format!("connecting to rpcbind at {rpcbind}"))?;
    c.set_read_timeout(Some(Duration::from_secs(2)))?;
    c.write_all(&wire)?;
    let mut mark = [0u8; 4];
    c.read_exact(&mut mark)?;
    let len = (u32::from_be_bytes(mark) & 0x7fff_ffff) as usize;
    if len > 1024 {
        bail!("rpcbind sent a {len}-byte reply to a SET");
    }
    let mut rec = vec![0u8; len];
    c.read_exact(&mut rec)?;
    let r = decode_reply(&rec).map_err(|e| anyhow::anyhow!("rpcbind reply: {e}"))?;
    if r.xid != xid || r.reply != Reply::Success || r.results.len() < 4 {
        bail!("rpcbind refused the call: {:?}", r.reply);
    }
    Ok(u32::from_be_bytes(r.results[..4].try_into().expect("4 bytes")) != 0)
}

/// The registrations of one server; withdrawn on drop.
pub struct Registration {
    rpcbind: SocketAddr,
    port: u16,
    entries: Vec<(u32, u32)>,
}

impl Registration {
    /// Register (prog, vers) for TCP on `port` for every pair in `entries`,
    /// and for UDP on the same port when `udp`. A stale mapping left by an
    /// earlier server is replaced (UNSET withdraws every protocol's).
    pub fn register(
        rpcbind: SocketAddr,
        port: u16,
        entries: Vec<(u32, u32)>,
        udp: bool,
    ) -> anyhow::Result<Registration> {
        let xid0 = std::process::id().wrapping_mul(2654435761);
        let prots: &[u32] = if udp { &[IPPROTO_TCP, IPPROTO_UDP] } else { &[IPPROTO_TCP] };
        for (i, &(prog, vers)) in entries.iter().enumerate() {
            let xid = xid0.wrapping_add(4 * i as u32);
            let _ = call(rpcbind, xid, PMAPPROC_UNSET, (prog, vers, IPPROTO_TCP), 0);
            for (k, &prot) in prots.iter().enumerate() {
                if !call(rpcbind, xid + 1 + k as u32, PMAPPROC_SET, (prog, vers, prot), port)? {
                    bail!("rpcbind did not accept program {prog} version {vers} on port {port} (protocol {prot})");
                }
            }
        }
        Ok(Registration { rpcbind, port, entries })
    }

    pub fn port(&self) -> u16 {
        self.port
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        for (i, &(prog, vers)) in self.entries.iter().enumerate() {
            let _ = call(self.rpcbind, 0x5eed_0000 + i as u32, PMAPPROC_UNSET, (prog, vers, IPPROTO_TCP), 0);
        }
    }
}
