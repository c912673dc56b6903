//! A service from C: a listener whose connections are attached and served by
//! a C request handler on the mux's workers (`connmux::service::Service`:
//! accept, attach, the handler run where a request was read, heavy
//! connections' requests spread over the CPUs by the lanes, replies written
//! by the connection's worker, failed connections reset and unattached).
//! The handler answers in a buffer the library owns, so the reply of a
//! request read with others leaves with theirs in one write, as for Rust
//! handlers.

use std::ffi::{c_char, c_int, c_void};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::BytesMut;
use connmux_rs::service::{Handler, Service, ServiceConfig, Verdict};
use connmux_rs::tls::rustls::ServerConfig;
use connmux_rs::{Bytes, Parser, PsockId, SockType};

use crate::error::{guard_int, Fail};
use crate::tls::connmux_tls;
use crate::{c_str, connmux_mux, connmux_parser, connmux_psock_id, mux_ref, out, parser_ref, psock_to_c, release};
use crate::{Handle, ParserKind};

const SERVICE_MAGIC: u64 = 0x636f_6e6e_7376_6331; // "connsvc1"

/// A handler's answer (`connmux_handler_fn`): no reply to this request.
pub const CONNMUX_REPLY_NONE: isize = 0;
/// A handler's answer: the peer misbehaved; reset and unattach its connection
/// (after the replies already made for it are written).
pub const CONNMUX_REPLY_CLOSE: isize = -1;

/// The room a handler gets for its reply when `connmux_service_start` is
/// given 0 (`reply_max`).
pub const CONNMUX_REPLY_MAX_DEFAULT: usize = 64 * 1024;

/// The most `reply_max` may be: a reply is one message, and a connection's
/// replies are bounded by the mux's limits, not by what a handler asks for.
const REPLY_MAX_LIMIT: usize = 64 << 20;

/// A request handler for `connmux_service_start`. Called with one whole
/// request (`request`, `len` bytes, as the parser framed it, header
/// included) from connection `from`, and `reply_cap` bytes at `reply` to
/// write the reply in: one whole message in the protocol's framing. Returns
/// the reply's length (1 to `reply_cap`), `CONNMUX_REPLY_NONE` (0) for no
/// reply, or `CONNMUX_REPLY_CLOSE` to reset the connection. Any other value
/// (another negative one, or more than `reply_cap`) closes the connection
/// too and is counted in `connmux_service_stats.handler_errors`.
///
/// It runs on the mux's I/O workers, and a connection whose requests run
/// long (50 µs or more, several in a row) has them run on lane threads on
/// every worker's CPU: many calls at once, on any thread, so `ctx` must be
/// safe to share. Keep it short and never block. Both pointers are valid
/// only during the call. Replies of one connection leave in request order,
/// except a heavy connection's, whose replies may leave in another order
/// (as under KCM: protocols that match replies by tag or xid need none).
pub type connmux_handler_fn = Option<
    unsafe extern "C" fn(
        ctx: *mut c_void,
        request: *const u8,
        len: usize,
        from: connmux_psock_id,
        reply: *mut u8,
        reply_cap: usize,
    ) -> isize,
>;

/// A running service (`connmux_service_start`): a listener, its
/// connections, and the handler serving them. Released by
/// `connmux_service_free`.
pub struct connmux_service {
    magic: u64,
    svc: Option<Service>,
    handler_errors: Arc<AtomicU64>,
}

impl Handle for connmux_service {
    fn magic(&mut self) -> &mut u64 {
        &mut self.magic
    }
}

impl Drop for connmux_service {
    fn drop(&mut self) {
        if let Some(s) = self.svc.take() {
            s.shutdown();
        }
    }
}

/// Counters of a service (`connmux_service_get_stats`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct connmux_service_stats {
    /// Connections accepted and attached.
    pub accepted: u64,
    /// Connections accepted whose attach failed (closed at once).
    pub attach_errors: u64,
    /// Connections closed: the peer failed (bad framing, a reset, an end
    /// of stream) or the handler answered `CONNMUX_REPLY_CLOSE`.
    pub closed: u64,
    /// Connections refused (reset at once) past `connmux_service_set_max_conns`.
    pub refused: u64,
    /// Handler answers that were neither a reply, `CONNMUX_REPLY_NONE` nor
    /// `CONNMUX_REPLY_CLOSE` (each closed its connection).
    pub handler_errors: u64,
    /// Connections reset at the cap (`connmux_service_set_max_conns`) to make
    /// room for a new one, because they had been idle (nothing received,
    /// nothing being written) for a second or longer, the idlest first
    /// (not counted in `closed`).
    pub evicted: u64,
}

/// The C handler and its context, as a `connmux` handler.
struct CHandler {
    f: unsafe extern "C" fn(*mut c_void, *const u8, usize, connmux_psock_id, *mut u8, usize) -> isize,
    ctx: Ctx,
    reply_max: usize,
    errors: Arc<AtomicU64>,
}

/// The handler's context pointer, used from every worker and lane thread.
struct Ctx(*mut c_void);

// SAFETY: `connmux_service_start`'s contract: `ctx` may be used from any
// thread, by many calls at once; the library only passes it back to the
// handler.
unsafe impl Send for Ctx {}
// SAFETY: as for `Send` above.
unsafe impl Sync for Ctx {}

impl CHandler {
    /// Run the C handler with `reply_max` bytes of room at the end of `buf`;
    /// `Ok` once its reply is there, else the verdict it asked for.
    fn call(&self, request: &[u8], from: PsockId, buf: &mut BytesMut) -> Result<(), Verdict> {
        if buf.capacity() - buf.len() < self.reply_max {
            // Twice the room: replies split off `buf` keep its allocation,
            // and room for one more only would make a new one a request.
            buf.reserve(2 * self.reply_max);
        }
        let start = buf.len();
        let room = buf.spare_capacity_mut();
        let cap = room.len().min(self.reply_max);
        let reply = room.as_mut_ptr().cast::<u8>();
        // SAFETY: `f` is the caller's handler (`connmux_service_start`'s
        // contract); `request` is readable for its length and `reply`
        // writable for `cap` bytes (spare capacity of `buf`) during the call.
        let n = unsafe { (self.f)(self.ctx.0, request.as_ptr(), request.len(), psock_to_c(from), reply, cap) };
        match n {
            CONNMUX_REPLY_NONE => Err(Verdict::NoReply),
            CONNMUX_REPLY_CLOSE => Err(Verdict::Close),
            n if n > 0 && n as usize <= cap => {
                // SAFETY: the handler wrote its reply's `n` bytes at `reply`,
                // the first `n` of `buf`'s spare capacity (its contract).
                unsafe { buf.set_len(start + n as usize) };
                Ok(())
            }
            _ => {
                self.errors.fetch_add(1, Ordering::Relaxed);
                Err(Verdict::Close)
            }
        }
    }
}

impl Handler for CHandler {
    fn handle(&self, request: Bytes, from: PsockId, scratch: &mut BytesMut) -> Verdict {
        match self.call(&request, from, scratch) {
            Ok(()) => Verdict::Reply(scratch.split().freeze()),
            Err(v) => v,
        }
    }

    fn handle_in_place(&self, request: &[u8], from: PsockId, _scratch: &mut BytesMut, out: &mut BytesMut) -> Verdict {
        // The reply goes straight after those of the same read.
        match self.call(request, from, out) {
            Ok(()) => Verdict::Appended,
            Err(v) => v,
        }
    }
}

/// # Safety
/// `p` is null or a pointer from `connmux_service_start` not yet freed.
unsafe fn service_ref<'a>(p: *const connmux_service) -> Result<&'a connmux_service, Fail> {
    // SAFETY: by the header's contract `p` is null or a live handle.
    let s = unsafe { p.as_ref() }.ok_or_else(|| Fail::null("svc"))?;
    if s.magic != SERVICE_MAGIC {
        return Err(Fail::new(libc::EBADF, "not a live connmux_service handle"));
    }
    Ok(s)
}

fn running(s: &connmux_service) -> Result<&Service, Fail> {
    s.svc.as_ref().ok_or_else(|| Fail::new(libc::EBADF, "the service has stopped"))
}

/// Start a service on `mux`: listen on `listen` ("IP:port"; port 0 takes a
/// free one, `connmux_service_port` says which), attach each accepted
/// connection with a fresh parser from `parser`, and answer each request
/// with `handler` (`connmux_handler_fn`) on the mux's workers, the reply
/// written on the connection the request came from. `reply_max`: the room
/// a handler gets for one reply (0: `CONNMUX_REPLY_MAX_DEFAULT`, 64 KiB).
/// A connection that fails (bad framing, too large a message, a reset) is
/// reset and unattached; one whose peer only closed its sending side gets
/// its replies, then a close. A mux serves at most one handler (-EEXIST
/// for a second); the application may still attach connections of its own
/// to it, which the handler then serves too. Stores a new handle in `*out`
/// and returns 0, or a negative errno: -EINVAL (address, `reply_max` over
/// 64 MiB), -EFAULT (a NULL handler or handle), -EOPNOTSUPP on the kernel
/// backend (AF_KCM has no workers to serve on), -EADDRINUSE and the like
/// from the listener.
///
/// # Safety
/// `mux` and `parser` are live handles; `listen` a NUL-terminated string;
/// `out` writable. `handler` and `ctx` stay valid, and `ctx` safe to use from
/// any thread at once, until `connmux_service_free` and `connmux_mux_free`
/// (and `connmux_sock_close` of every socket of this mux) have all
/// returned: a worker may call the handler until the mux's workers stop.
#[no_mangle]
pub unsafe extern "C" fn connmux_service_start(
    mux: *const connmux_mux,
    listen: *const c_char,
    parser: *const connmux_parser,
    handler: connmux_handler_fn,
    ctx: *mut c_void,
    reply_max: usize,
    out_svc: *mut *mut connmux_service,
) -> c_int {
    // SAFETY: forwarded contract of this function.
    unsafe { start_into(out_svc, || start(mux, listen, parser, None, handler, ctx, reply_max)) }
}

/// `connmux_service_start` for TLS clients: every accepted connection is
/// attached with a server connection of `tls` (`connmux_tls_server_new`;
/// with a client CA, mutual TLS), the handshake and the records run on the
/// workers, and the handler sees the decrypted requests; a failed
/// handshake resets the connection (counted in `connmux_tls_get_stats`).
/// -EINVAL for a client's configuration; otherwise as
/// `connmux_service_start`. The service keeps its own reference to the
/// configuration: `tls` may be freed once this returns.
///
/// # Safety
/// As `connmux_service_start`; `tls` is a live handle.
#[no_mangle]
pub unsafe extern "C" fn connmux_service_start_tls(
    mux: *const connmux_mux,
    listen: *const c_char,
    parser: *const connmux_parser,
    tls: *const connmux_tls,
    handler: connmux_handler_fn,
    ctx: *mut c_void,
    reply_max: usize,
    out_svc: *mut *mut connmux_service,
) -> c_int {
    // SAFETY: forwarded contract of this function.
    unsafe {
        start_into(out_svc, || {
            let server = crate::tls::server_config(tls)?;
            start(mux, listen, parser, Some(server), handler, ctx, reply_max)
        })
    }
}

/// `*out_svc` cleared, then the service `make` starts stored there: 0, or
/// the negative errno it failed with.
///
/// # Safety
/// `out_svc` is writable; `make` upholds the start calls' contract.
unsafe fn start_into(
    out_svc: *mut *mut connmux_service,
    make: impl FnOnce() -> Result<connmux_service, Fail>,
) -> c_int {
    guard_int(|| {
        // SAFETY: forwarded contract of this function.
        let slot = unsafe { out(out_svc, "out") }?;
        *slot = std::ptr::null_mut();
        *slot = Box::into_raw(Box::new(make()?));
        Ok(0)
    })
}

/// The two start calls' common part.
///
/// # Safety
/// `connmux_service_start`'s contract.
unsafe fn start(
    mux: *const connmux_mux,
    listen: *const c_char,
    parser: *const connmux_parser,
    tls: Option<Arc<ServerConfig>>,
    handler: connmux_handler_fn,
    ctx: *mut c_void,
    reply_max: usize,
) -> Result<connmux_service, Fail> {
    // SAFETY: forwarded contract of this function.
    let m = unsafe { mux_ref(mux) }?;
    // SAFETY: forwarded contract of this function.
    let listen = unsafe { c_str(listen, "listen") }?;
    // SAFETY: forwarded contract of this function.
    let p = unsafe { parser_ref(parser) }?;
    let f = handler.ok_or_else(|| Fail::null("handler"))?;
    let listen: SocketAddr =
        listen.parse().map_err(|e| Fail::inval(format!("listen address {listen:?}: {e} (want IP:port)")))?;
    let reply_max = match reply_max {
        0 => CONNMUX_REPLY_MAX_DEFAULT,
        n if n > REPLY_MAX_LIMIT => return Err(Fail::inval(format!("reply_max {n} is over {REPLY_MAX_LIMIT} bytes"))),
        n => n,
    };
    // Built once here, so that a parser which cannot be made fails the
    // call rather than each accepted connection.
    p.kind.build()?;
    let kind: ParserKind = p.kind.clone();
    let make = Arc::new(move || -> Box<dyn Parser> {
        // Made once above from the same description: a spec parses the
        // same each time and a BPF program is already loaded.
        kind.build().unwrap_or_else(|e| unreachable!("parser built once already: {}", e.msg))
    });
    let errors = Arc::new(AtomicU64::new(0));
    let h = Arc::new(CHandler { f, ctx: Ctx(ctx), reply_max, errors: errors.clone() });
    let cfg = ServiceConfig { listen, sock_type: SockType::Dgram, parser: make };
    let svc = match tls {
        None => Service::start(m.mux.clone(), cfg, h)?,
        Some(t) => Service::start_tls(m.mux.clone(), cfg, h, t)?,
    };
    Ok(connmux_service { magic: SERVICE_MAGIC, svc: Some(svc), handler_errors: errors })
}

/// The port the service listens on (the one chosen for port 0), or a
/// negative errno.
///
/// # Safety
/// `svc` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn connmux_service_port(svc: *const connmux_service) -> c_int {
    guard_int(|| {
        // SAFETY: forwarded contract of this function.
        let s = unsafe { service_ref(svc) }?;
        Ok(running(s)?.local_addr().port() as isize)
    })
}

/// Cap the connections attached at once (0: no cap; a service starts with
/// the library's cap, 10,000). Past `max`, the connection idle longest
/// (nothing received, nothing being written) makes room for the new one if
/// it has been idle for a second or longer: it is reset and counted in
/// `evicted`; otherwise the new connection is reset as soon as it is
/// accepted and counted in `refused`. Returns 0 or a negative errno.
///
/// # Safety
/// `svc` is NULL or a live handle.
#[no_mangle]
pub unsafe extern "C" fn connmux_service_set_max_conns(svc: *const connmux_service, max: usize) -> c_int {
    guard_int(|| {
        // SAFETY: forwarded contract of this function.
        let s = unsafe { service_ref(svc) }?;
        running(s)?.set_max_conns((max > 0).then_some(max));
        Ok(0)
    })
}

/// Fill `*st` with the service's counters. Returns 0 or a negative errno.
///
/// # Safety
/// `svc` is NULL or a live handle; `st` is writable.
#[no_mangle]
pub unsafe extern "C" fn connmux_service_get_stats(
    svc: *const connmux_service,
    st: *mut connmux_service_stats,
) -> c_int {
    guard_int(|| {
        // SAFETY: forwarded contract of this function.
        let s = unsafe { service_ref(svc) }?;
        // SAFETY: forwarded contract of this function.
        let st = unsafe { out(st, "st") }?;
        let c = running(s)?.stats();
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        *st = connmux_service_stats {
            accepted: get(&c.accepted),
            attach_errors: get(&c.attach_errors),
            closed: get(&c.closed),
            refused: get(&c.refused),
            handler_errors: get(&s.handler_errors),
            evicted: get(&c.evicted),
        };
        Ok(0)
    })
}

/// Stop the service (NULL is ignored): stop accepting, unattach every
/// connection (closing it), stop its threads. The mux's workers keep the
/// handler until the mux stops (see `connmux_service_start`). Must not race
/// with other calls on the same handle.
///
/// # Safety
/// `svc` is NULL or a live handle, not used again after this call.
#[no_mangle]
pub unsafe extern "C" fn connmux_service_free(svc: *mut connmux_service) {
    // SAFETY: forwarded contract of this function.
    unsafe { release(svc, service_ref) }
}
