//! TLS psocks (`Mux::attach_tls`) over loopback TCP against real rustls peers
//! running on blocking sockets in other threads: framing of the decrypted
//! stream both ways, records carrying many messages and messages spread over
//! records, messages that wait for the handshake, client mode, bad peers
//! (not TLS, a refused certificate, a forged record, a close in the middle of
//! a message) counted and failed alone, and backpressure. Every test runs on
//! both drivers.

#[macro_use]
mod common;

use std::io::{ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use connmux::tls::rustls;
use connmux::{PsockError, RxError, SockType};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};

/// A CA and a server certificate it signed, for "localhost" and 127.0.0.1.
struct Pki {
    ca: CertificateDer<'static>,
    cert: CertificateDer<'static>,
    key: Vec<u8>,
}

fn pki() -> Pki {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params.distinguished_name.push(rcgen::DnType::CommonName, "connmux test CA");
    ca_params.key_usages = vec![rcgen::KeyUsagePurpose::KeyCertSign, rcgen::KeyUsagePurpose::DigitalSignature];
    let ca = rcgen::CertifiedIssuer::self_signed(ca_params, ca_key).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let params = rcgen::CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()]).unwrap();
    let cert = params.signed_by(&key, &ca).unwrap();
    Pki { ca: ca.der().clone(), cert: cert.der().clone(), key: key.serialize_der() }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn server_config(p: &Pki) -> Arc<rustls::ServerConfig> {
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(p.key.clone()));
    Arc::new(
        rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(vec![p.cert.clone()], key)
            .unwrap(),
    )
}

fn client_config(ca: &CertificateDer<'static>) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.clone()).unwrap();
    Arc::new(
        rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth(),
    )
}

fn server_conn(p: &Pki) -> rustls::ServerConnection {
    rustls::ServerConnection::new(server_config(p)).unwrap()
}

type Client = rustls::StreamOwned<rustls::ClientConnection, TcpStream>;

/// A blocking rustls client on the peer side of a loopback pair.
fn client(p: &Pki, peer: TcpStream) -> Client {
    let conn = rustls::ClientConnection::new(client_config(&p.ca), ServerName::try_from("localhost").unwrap()).unwrap();
    rustls::StreamOwned::new(conn, peer)
}

fn read_msg(r: &mut impl Read) -> Vec<u8> {
    let mut hdr = [0u8; 4];
    r.read_exact(&mut hdr).unwrap();
    let mut body = vec![0u8; u32::from_be_bytes(hdr) as usize];
    r.read_exact(&mut body).unwrap();
    body
}

fn body(i: u32, len: usize) -> Vec<u8> {
    let mut b: Vec<u8> = (0..len).map(|k| (k as u32).wrapping_mul(31).wrapping_add(i) as u8).collect();
    if len >= 4 {
        b[..4].copy_from_slice(&i.to_be_bytes());
    }
    b
}

/// The next psock failure, within WAIT.
fn next_error(mux: &connmux::Mux) -> connmux::PsockEvent {
    mux.events().recv_timeout(WAIT).expect("a psock error within the wait")
}

fn tls_error(e: &PsockError) -> Option<&str> {
    match e {
        PsockError::Rx(RxError::Tls(why)) => Some(why),
        _ => None,
    }
}

/// A client pipelining small requests, each in a record of its own, 500
/// records in one write (so in one read of the server's): every message
/// reaches the application's socket. (The plaintext of one read was taken
/// out of rustls 64 records at most, the rest left as if the core were
/// full, and the psock read no more.)
fn many_small_records_in_one_read_are_all_received() {
    let p = pki();
    let mux = mux_with(|_| {});
    let sock = mux.socket(SockType::Dgram).unwrap();
    sock.set_read_timeout(Some(WAIT)).unwrap();
    let (ours, peer) = pair();
    let psock = mux.attach_tls(ours, server_conn(&p), l4()).unwrap();
    let mut c = client(&p, peer);
    tls_call_via(&mut c, &sock, psock, b"hello");
    for i in 0..500u32 {
        // (rustls makes a record of each write.)
        c.conn.writer().write_all(&framed(&i.to_be_bytes())).unwrap();
    }
    c.flush().unwrap();
    let mut buf = [0u8; 64];
    for i in 0..500u32 {
        let got = sock.recv_from(&mut buf).unwrap_or_else(|e| panic!("message {i} on {:?}: {e}", driver()));
        assert_eq!((&buf[4..got.len], got.psock), (&i.to_be_bytes()[..], psock), "message {i} on {:?}", driver());
    }
}

/// One message from the client, received on `sock` from `psock`, and its
/// echo sent back on the psock and read by the client.
fn tls_call_via(c: &mut Client, sock: &connmux::KcmSocket, psock: connmux::PsockId, b: &[u8]) {
    c.write_all(&framed(b)).unwrap();
    c.flush().unwrap();
    let mut buf = [0u8; 256];
    let got = sock.recv_from(&mut buf).unwrap();
    assert_eq!((&buf[4..got.len], got.psock), (b, psock));
    sock.send_to(&buf[..got.len], psock).unwrap();
    assert_eq!(read_msg(c), b);
}

/// Server psock, rustls client: many messages in one record, a message split
/// over several records, a big message over many records; replies framed back.
fn server_frames_decrypted_messages_both_ways() {
    let p = pki();
    let mux = mux_with(|_| {});
    let sock = mux.socket(SockType::Dgram).unwrap();
    sock.set_read_timeout(Some(WAIT)).unwrap();
    let (ours, peer) = pair();
    let psock = mux.attach_tls(ours, server_conn(&p), l4()).unwrap();
    let mut c = client(&p, peer);

    // 50 messages in one write: one TLS record.
    let mut batch = Vec::new();
    for i in 0..50 {
        batch.extend_from_slice(&framed(&body(i, 20)));
    }
    c.write_all(&batch).unwrap();
    // One message in three records (header split from the body too).
    let m = framed(&body(50, 300));
    c.write_all(&m[..2]).unwrap();
    c.flush().unwrap();
    std::thread::sleep(Duration::from_millis(20));
    c.write_all(&m[2..100]).unwrap();
    c.flush().unwrap();
    std::thread::sleep(Duration::from_millis(20));
    c.write_all(&m[100..]).unwrap();
    // A 100 KiB message: at least seven 16 KiB records.
    c.write_all(&framed(&body(51, 100 << 10))).unwrap();
    c.flush().unwrap();

    for i in 0..50 {
        let got = sock.recv_msg().unwrap();
        assert_eq!(got.psock, psock);
        assert_eq!(&got.data[..], &framed(&body(i, 20))[..], "message {i} on {:?}", driver());
    }
    assert_eq!(&sock.recv_msg().unwrap().data[..], &m[..]);
    assert_eq!(&sock.recv_msg().unwrap().data[..], &framed(&body(51, 100 << 10))[..]);

    // Replies: 200 small ones sent back to back (records carry several) and a
    // big one, framed by the client as it reads the decrypted stream.
    for i in 0..200 {
        sock.send_to(&framed(&body(1000 + i, 40)), psock).unwrap();
    }
    sock.send_to(&framed(&body(2000, 70 << 10)), psock).unwrap();
    c.sock.set_read_timeout(Some(WAIT)).unwrap();
    for i in 0..200 {
        assert_eq!(read_msg(&mut c), body(1000 + i, 40), "reply {i} on {:?}", driver());
    }
    assert_eq!(read_msg(&mut c), body(2000, 70 << 10));
    let st = mux.psock_stats(psock).unwrap();
    assert_eq!(st.rx_msgs, 52);
    assert_eq!(st.tx_msgs, 201);
    let t = mux.tls_stats();
    assert_eq!((t.attached, t.handshakes, t.handshake_failures, t.errors), (1, 1, 0, 0));
    // Records, not plaintext, went over the wire: the client's TLS decoded them.
    assert!(c.conn.negotiated_cipher_suite().is_some());
}

/// Messages sent to a TLS psock before its handshake completes wait, and go
/// out (as records) once it has.
fn messages_wait_for_the_handshake() {
    let p = pki();
    let mux = mux_with(|_| {});
    let sock = mux.socket(SockType::Dgram).unwrap();
    let (ours, mut peer) = pair();
    let psock = mux.attach_tls(ours, server_conn(&p), l4()).unwrap();
    for i in 0..5 {
        sock.send_to(&framed(&body(i, 64)), psock).unwrap();
    }
    // Nothing may reach the wire before the handshake (the client has not
    // even sent its hello).
    peer.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
    let mut b = [0u8; 16];
    match peer.read(&mut b) {
        Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
        other => panic!("bytes before the handshake on {:?}: {other:?}", driver()),
    }
    peer.set_read_timeout(Some(WAIT)).unwrap();
    let mut c = client(&p, peer);
    for i in 0..5 {
        assert_eq!(read_msg(&mut c), body(i, 64), "on {:?}", driver());
    }
    assert_eq!(mux.tls_stats().handshakes, 1);
}

/// A client psock: the mux speaks first (ClientHello) to a rustls server that
/// echoes what it decrypts.
fn client_psock_to_a_rustls_server() {
    let p = pki();
    let mux = mux_with(|_| {});
    let sock = mux.socket(SockType::Dgram).unwrap();
    sock.set_read_timeout(Some(WAIT)).unwrap();
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let cfg = server_config(&p);
    let server = std::thread::spawn(move || {
        let (s, _) = l.accept().unwrap();
        s.set_read_timeout(Some(WAIT)).unwrap();
        let mut tls = rustls::StreamOwned::new(rustls::ServerConnection::new(cfg).unwrap(), s);
        let mut buf = vec![0u8; 64 << 10];
        let mut echoed = 0usize;
        // Echo until the client's 20 messages (20 × 1028 bytes) are back.
        while echoed < 20 * 1028 {
            let n = tls.read(&mut buf).unwrap();
            assert!(n > 0);
            tls.write_all(&buf[..n]).unwrap();
            tls.flush().unwrap();
            echoed += n;
        }
    });
    let conn = TcpStream::connect(addr).unwrap();
    let cc = rustls::ClientConnection::new(client_config(&p.ca), ServerName::try_from("localhost").unwrap()).unwrap();
    let psock = mux.attach_tls(conn, cc, l4()).unwrap();
    for i in 0..20 {
        sock.send_to(&framed(&body(i, 1024)), psock).unwrap();
    }
    for i in 0..20 {
        let m = sock.recv_msg().unwrap();
        assert_eq!(&m.data[..], &framed(&body(i, 1024))[..], "echo {i} on {:?}", driver());
    }
    server.join().unwrap();
    assert_eq!(mux.tls_stats().handshakes, 1);
}

/// A good client exchanging messages while bad peers come and go: garbage
/// instead of a ClientHello, and a client that does not trust the server's
/// certificate. Each bad one fails alone (typed error, counted); the good
/// client loses nothing.
fn bad_peers_fail_alone() {
    let p = pki();
    let other = pki(); // a CA that did not sign the server's certificate
    let mux = mux_with(|_| {});
    let sock = mux.socket(SockType::Dgram).unwrap();
    sock.set_read_timeout(Some(WAIT)).unwrap();
    let (ours, peer) = pair();
    let good = mux.attach_tls(ours, server_conn(&p), l4()).unwrap();
    let mut c = client(&p, peer);
    const N: u32 = 300;
    let writer = std::thread::spawn(move || {
        for i in 0..N {
            c.write_all(&framed(&body(i, 100))).unwrap();
            if i % 50 == 0 {
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        c.flush().unwrap();
        c
    });

    // Garbage instead of a ClientHello.
    let (ours, mut bad1) = pair();
    let b1 = mux.attach_tls(ours, server_conn(&p), l4()).unwrap();
    bad1.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let ev = next_error(&mux);
    assert_eq!(ev.psock, b1);
    let why = tls_error(&ev.error).unwrap_or_else(|| panic!("not a TLS error: {:?}", ev.error)).to_string();
    assert!(!why.is_empty());
    assert_eq!(mux.psock_error(b1), Some(ev.error.clone()));
    // The peer got a TLS alert record (content type 21) before we drop it.
    let mut rec = [0u8; 1];
    if bad1.read(&mut rec).unwrap_or(0) == 1 {
        assert_eq!(rec[0], 21, "an alert record");
    }
    mux.abort(b1).unwrap();

    // A client that refuses the server's certificate (alert during the handshake).
    let (ours, peer) = pair();
    let b2 = mux.attach_tls(ours, server_conn(&p), l4()).unwrap();
    let refused = std::thread::spawn(move || {
        let mut c = client(&other, peer);
        let e = c.write_all(b"\0\0\0\x01x").and_then(|_| c.flush()).and_then(|_| {
            let mut b = [0u8; 1];
            c.read(&mut b).map(|_| ())
        });
        assert!(e.is_err(), "the client must refuse the certificate");
    });
    let ev = next_error(&mux);
    assert_eq!(ev.psock, b2);
    assert!(tls_error(&ev.error).is_some(), "{:?}", ev.error);
    refused.join().unwrap();
    mux.abort(b2).unwrap();

    // The good client: every message, in order.
    for i in 0..N {
        let m = sock.recv_msg().unwrap();
        assert_eq!(m.psock, good);
        assert_eq!(&m.data[..], &framed(&body(i, 100))[..], "good message {i} on {:?}", driver());
    }
    let mut c = writer.join().unwrap();
    sock.send_to(&framed(b"still fine"), good).unwrap();
    c.sock.set_read_timeout(Some(WAIT)).unwrap();
    assert_eq!(read_msg(&mut c), b"still fine");
    let t = mux.tls_stats();
    assert_eq!((t.attached, t.handshakes, t.handshake_failures, t.errors), (3, 1, 2, 0), "on {:?}", driver());
    assert!(mux.psock_error(good).is_none());
}

/// After the handshake: a record that fails to authenticate is a TLS error
/// (counted as such), and the messages before it were delivered.
fn forged_record_after_the_handshake() {
    let p = pki();
    let mux = mux_with(|_| {});
    let sock = mux.socket(SockType::Dgram).unwrap();
    sock.set_read_timeout(Some(WAIT)).unwrap();
    let (ours, peer) = pair();
    let psock = mux.attach_tls(ours, server_conn(&p), l4()).unwrap();
    let mut raw = peer.try_clone().unwrap();
    let mut c = client(&p, peer);
    c.write_all(&framed(b"before")).unwrap();
    c.flush().unwrap();
    assert_eq!(&sock.recv_msg().unwrap().data[..], &framed(b"before")[..]);
    // An answer the client reads: the server's records so far have all
    // been sent.
    sock.send_to(&framed(b"ack"), psock).unwrap();
    c.sock.set_read_timeout(Some(WAIT)).unwrap();
    assert_eq!(read_msg(&mut c), b"ack");
    // An application-data record of the right shape whose tag cannot verify.
    let mut rec = vec![23u8, 3, 3, 0, 64];
    rec.extend((0..64u8).map(|i| i.wrapping_mul(7)));
    raw.write_all(&rec).unwrap();
    let ev = next_error(&mux);
    assert_eq!(ev.psock, psock);
    assert!(tls_error(&ev.error).is_some(), "{:?}", ev.error);
    // Reset at once, as an application's reaper would: the alert was
    // written before the failure was raised, so the peer reads it first.
    mux.abort(psock).unwrap();
    let mut b = [0u8; 16];
    let got = c.read(&mut b);
    let e = got.expect_err("the session failed");
    assert!(e.to_string().contains("alert"), "the peer read {e:?} (no alert) on {:?}", driver());
    let t = mux.tls_stats();
    assert_eq!((t.handshakes, t.handshake_failures, t.errors), (1, 0, 1), "on {:?}", driver());
}

/// close_notify between messages ends the psock as a FIN does; in the middle
/// of a message it is a TLS error.
fn close_notify_between_and_inside_messages() {
    let p = pki();
    let mux = mux_with(|_| {});
    let sock = mux.socket(SockType::Dgram).unwrap();
    sock.set_read_timeout(Some(WAIT)).unwrap();

    let (ours, peer) = pair();
    let clean = mux.attach_tls(ours, server_conn(&p), l4()).unwrap();
    let mut c = client(&p, peer);
    c.write_all(&framed(b"last words")).unwrap();
    c.conn.send_close_notify();
    c.flush().unwrap();
    assert_eq!(&sock.recv_msg().unwrap().data[..], &framed(b"last words")[..]);
    let ev = next_error(&mux);
    assert_eq!((ev.psock, ev.error), (clean, PsockError::Closed));

    let (ours, peer) = pair();
    let cut = mux.attach_tls(ours, server_conn(&p), l4()).unwrap();
    let mut c = client(&p, peer);
    let m = framed(&body(7, 500));
    c.write_all(&m[..200]).unwrap();
    c.conn.send_close_notify();
    c.flush().unwrap();
    let ev = next_error(&mux);
    assert_eq!(ev.psock, cut);
    assert!(tls_error(&ev.error).is_some_and(|w| w.contains("close_notify")), "{:?}", ev.error);
    let t = mux.tls_stats();
    assert_eq!((t.handshakes, t.errors), (2, 1), "on {:?}", driver());
    drop(c);
}

/// Backpressure: nobody receives, so the core fills and TLS stops taking
/// ciphertext (the TCP window closes); then every message arrives in order.
fn backpressure_loses_nothing() {
    let p = pki();
    let mux = mux_with(|c| {
        c.core.psock_rx_buf = 16 << 10;
        c.core.max_msg_size = 16 << 10;
    });
    let sock = mux.socket(SockType::Dgram).unwrap();
    sock.set_recv_disable(true).unwrap();
    let (ours, peer) = pair();
    socket2::SockRef::from(&ours).set_recv_buffer_size(32 << 10).unwrap();
    socket2::SockRef::from(&peer).set_send_buffer_size(32 << 10).unwrap();
    // Second descriptors of both ends, to look at their queues.
    let probe = ours.try_clone().unwrap();
    let peer_probe = peer.try_clone().unwrap();
    let psock = mux.attach_tls(ours, server_conn(&p), l4()).unwrap();
    const N: u32 = 2000; // 2 MB: far more than the core, rustls and both kernels hold
    let writer = std::thread::spawn(move || {
        let mut c = client(&p, peer);
        for i in 0..N {
            c.write_all(&framed(&body(i, 1020))).unwrap();
        }
        c.flush().unwrap();
        c
    });
    // The writer must be stuck well before the end: the worker stops taking
    // ciphertext, so it piles up in our connection's receive queue or, once
    // the window is closed, in the writer's send queue (a wait for that, not
    // a sleep; the writer cannot finish, 2 MB do not fit). The window can
    // close with little queued here: a segment the worker read part of
    // still charges its whole size against the receive buffer.
    eventually(|| {
        let queued = connmux_sys::socket::inq(std::os::fd::AsRawFd::as_raw_fd(&probe)).unwrap();
        let unsent = connmux_sys::socket::outq(std::os::fd::AsRawFd::as_raw_fd(&peer_probe)).unwrap();
        (queued >= 16 << 10 || (queued > 0 && unsent >= 32 << 10)).then_some(())
    });
    let parsed = mux.psock_stats(psock).unwrap().rx_msgs;
    assert!(parsed < 100, "{parsed} messages parsed while nobody can take them, on {:?}", driver());
    sock.set_recv_disable(false).unwrap();
    sock.set_read_timeout(Some(WAIT)).unwrap();
    let end = Instant::now() + Duration::from_secs(60);
    for i in 0..N {
        assert!(Instant::now() < end);
        let m = sock.recv_msg().unwrap();
        assert_eq!(&m.data[..], &framed(&body(i, 1020))[..], "message {i} on {:?}", driver());
    }
    let _client = writer.join().unwrap(); // still open: no end reported
    assert!(mux.psock_error(psock).is_none(), "{:?} on {:?}", mux.psock_error(psock), driver());
}

/// The peer sends everything and closes (no close_notify, as many clients
/// do) while the psock is held back: every message still arrives, in order,
/// and then the end is reported as a plain close (it fell between messages).
fn end_after_backpressure_comes_after_the_last_message() {
    let p = pki();
    let mux = mux_with(|c| {
        c.core.psock_rx_buf = 16 << 10;
        c.core.max_msg_size = 16 << 10;
    });
    let sock = mux.socket(SockType::Dgram).unwrap();
    sock.set_read_timeout(Some(WAIT)).unwrap();
    let (ours, peer) = pair();
    socket2::SockRef::from(&ours).set_recv_buffer_size(32 << 10).unwrap();
    let psock = mux.attach_tls(ours, server_conn(&p), l4()).unwrap();
    const N: u32 = 400;
    const HOLD_AT: u32 = 340; // the last 60 KiB fit in the buffers on the way
    let writer = std::thread::spawn(move || {
        let mut c = client(&p, peer);
        for i in 0..N {
            c.write_all(&framed(&body(i, 1020))).unwrap();
        }
        c.flush().unwrap();
        // FIN without close_notify. The socket stays open: closing it with
        // the server's session tickets unread would send a reset instead.
        c.sock.shutdown(std::net::Shutdown::Write).unwrap();
        c
    });
    for i in 0..N {
        if i == HOLD_AT {
            // Nobody takes messages while the writer finishes and closes.
            sock.set_recv_disable(true).unwrap();
            std::thread::sleep(Duration::from_millis(300));
            sock.set_recv_disable(false).unwrap();
        }
        let m = sock.recv_msg().unwrap_or_else(|e| {
            panic!("message {i} on {:?}: {e}; {:?} {:?}", driver(), mux.psock_stats(psock), mux.psock_error(psock))
        });
        assert_eq!(&m.data[..], &framed(&body(i, 1020))[..], "message {i} on {:?}", driver());
    }
    let _client = writer.join().unwrap();
    let ev = next_error(&mux);
    assert_eq!((ev.psock, ev.error), (psock, PsockError::Closed), "on {:?}", driver());
    assert_eq!(mux.tls_stats().errors, 0);
}

/// The mux owns a TLS psock's connection: unattaching closes it.
fn unattach_closes_the_connection() {
    let p = pki();
    let mux = mux_with(|_| {});
    let sock = mux.socket(SockType::Dgram).unwrap();
    sock.set_read_timeout(Some(WAIT)).unwrap();
    let (ours, peer) = pair();
    let psock = mux.attach_tls(ours, server_conn(&p), l4()).unwrap();
    let mut c = client(&p, peer);
    c.write_all(&framed(b"hi")).unwrap();
    c.flush().unwrap();
    assert_eq!(&sock.recv_msg().unwrap().data[..], &framed(b"hi")[..]);
    mux.unattach_id(psock).unwrap();
    let mut b = [0u8; 8];
    // The client sees the end (as an unexpected EOF: no close_notify).
    let r = c.read(&mut b);
    assert!(matches!(&r, Ok(0)) || r.as_ref().is_err_and(|e| e.kind() == ErrorKind::UnexpectedEof), "{r:?}");
}

/// An echo service over TLS on loopback, with the PKI's server certificate.
fn tls_echo_service(p: &Pki) -> connmux::service::Service {
    use connmux::service::{Service, ServiceConfig, Verdict};
    let cfg =
        ServiceConfig { listen: "127.0.0.1:0".parse().unwrap(), sock_type: SockType::Dgram, parser: Arc::new(l4) };
    let echo = |req: connmux::Bytes, _: connmux::PsockId, _: &mut bytes::BytesMut| Verdict::Reply(req);
    Service::start_tls(mux_with(|_| {}), cfg, Arc::new(echo), server_config(p)).unwrap()
}

/// `Service::start_tls`: accepted connections are TLS psocks served in place.
fn service_over_tls() {
    let p = pki();
    let svc = tls_echo_service(&p);
    let mut clients = Vec::new();
    for _ in 0..3 {
        let s = TcpStream::connect(svc.local_addr()).unwrap();
        s.set_read_timeout(Some(WAIT)).unwrap();
        clients.push(client(&p, s));
    }
    for (k, c) in clients.iter_mut().enumerate() {
        for i in 0..10 {
            c.write_all(&framed(&body(100 * k as u32 + i, 50))).unwrap();
        }
        c.flush().unwrap();
    }
    for (k, c) in clients.iter_mut().enumerate() {
        for i in 0..10 {
            assert_eq!(read_msg(c), body(100 * k as u32 + i, 50), "on {:?}", driver());
        }
    }
    assert_eq!(svc.mux().tls_stats().handshakes, 3);
}

/// A client of a TLS service sends its requests, then close_notify and FIN
/// (a half-close): it still gets every answer, in order, then the server's
/// close_notify (a clean end of the TLS stream) and FIN, and the service
/// lets the connection go. The replies still in TLS or in a ring send when
/// the connection drained are not lost to a reset.
fn service_closes_in_order_after_a_half_close() {
    let p = pki();
    let svc = tls_echo_service(&p);
    const N: u32 = 500;
    for round in 0..3 {
        let s = TcpStream::connect(svc.local_addr()).unwrap();
        s.set_read_timeout(Some(WAIT)).unwrap();
        let mut c = client(&p, s);
        for i in 0..N {
            c.write_all(&framed(&body(i, 100))).unwrap();
        }
        c.conn.send_close_notify();
        c.flush().unwrap();
        c.sock.shutdown(std::net::Shutdown::Write).unwrap();
        for i in 0..N {
            assert_eq!(read_msg(&mut c), body(i, 100), "round {round}, reply {i} on {:?}", driver());
        }
        let mut b = [0u8; 1];
        match c.read(&mut b) {
            Ok(0) => {}
            other => panic!("round {round}: after the last reply {other:?}, not close_notify, on {:?}", driver()),
        }
    }
    eventually(|| (svc.mux().psock_count() == 0).then_some(()));
    assert_eq!(svc.mux().tls_stats().errors, 0);
}

// ------------------------------------------------ served TLS psocks -------

/// One request over TLS, its echo.
fn tls_call(c: &mut Client, b: &[u8]) {
    c.write_all(&framed(b)).unwrap();
    c.flush().unwrap();
    assert_eq!(read_msg(c), b);
}

/// A connection to `svc` (reads bounded by WAIT, no Nagle).
fn tcp_client(svc: &connmux::service::Service) -> TcpStream {
    let s = TcpStream::connect(svc.local_addr()).unwrap();
    s.set_read_timeout(Some(WAIT)).unwrap();
    s.set_nodelay(true).unwrap();
    s
}

/// A connection to `svc` whose receive buffer (so its window) is 4 KiB.
fn small_window_client(svc: &connmux::service::Service) -> TcpStream {
    let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    s.set_recv_buffer_size(4096).unwrap();
    s.connect(&svc.local_addr().into()).unwrap();
    let s: TcpStream = s.into();
    s.set_read_timeout(Some(WAIT)).unwrap();
    s.set_nodelay(true).unwrap();
    s
}

/// Calls until the service's only connection is attached. The psock and
/// the calls made, 4-byte bodies each way.
fn tls_calls_until_attached(svc: &connmux::service::Service, c: &mut Client) -> (connmux::PsockId, u64) {
    calls_until_attached(svc, || tls_call(c, b"ping"))
}

/// A served TLS connection: single calls and a burst of 32 in one record
/// are answered in order and counted once (plaintext bytes).
fn a_served_tls_connection_counts_its_calls_once() {
    let p = pki();
    let svc = tls_echo_service(&p);
    let s = tcp_client(&svc);
    let mut c = client(&p, s);
    let (psock, pings) = tls_calls_until_attached(&svc, &mut c);
    for i in 0..100u32 {
        tls_call(&mut c, &i.to_be_bytes());
    }
    let burst: Vec<u8> = (0..32u32).flat_map(|i| framed(&i.to_le_bytes())).collect();
    c.write_all(&burst).unwrap();
    c.flush().unwrap();
    for i in 0..32u32 {
        assert_eq!(read_msg(&mut c), i.to_le_bytes(), "burst reply {i} on {:?}", driver());
    }
    let calls = pings + 132;
    let st = eventually(|| {
        let st = svc.mux().psock_stats(psock).unwrap();
        (st.rx_msgs >= calls && st.tx_msgs >= calls).then_some(st)
    });
    assert_eq!((st.rx_msgs, st.tx_msgs), (calls, calls), "on {:?}", driver());
    assert_eq!((st.rx_bytes, st.tx_bytes), (8 * calls, 8 * calls), "on {:?}", driver());
    assert_eq!(svc.mux().tls_stats().errors, 0);
}

/// A message sent to a served TLS connection from another thread goes
/// out (encrypted, in order with the replies); a message split over two
/// records and two reads is answered whole; then the connection is served
/// as before.
fn a_served_tls_connection_takes_sends_from_elsewhere_and_split_messages() {
    let p = pki();
    let svc = tls_echo_service(&p);
    let s = tcp_client(&svc);
    let mut c = client(&p, s);
    let (psock, _) = tls_calls_until_attached(&svc, &mut c);
    let sock = svc.mux().socket(SockType::Dgram).unwrap();
    sock.send_to(&framed(b"pushed"), psock).unwrap();
    assert_eq!(read_msg(&mut c), b"pushed");
    tls_call(&mut c, b"after the push");
    let msg = framed(&body(7, 3000));
    c.write_all(&msg[..1000]).unwrap();
    c.flush().unwrap();
    std::thread::sleep(Duration::from_millis(20));
    c.write_all(&msg[1000..]).unwrap();
    c.flush().unwrap();
    assert_eq!(read_msg(&mut c), body(7, 3000));
    tls_call(&mut c, b"and after the split");
    assert_eq!(svc.mux().psocks(), vec![psock]);
    assert_eq!(svc.mux().tls_stats().errors, 0);
}

/// A client of a served TLS connection that reads nothing while it sends
/// 1.5 MB of requests through a 4 KiB receive window: once it reads it
/// gets every reply, in order, each counted once.
fn a_slow_reader_of_a_tls_connection_gets_every_reply_in_order() {
    let p = pki();
    let svc = tls_echo_service(&p);
    let mut c = client(&p, small_window_client(&svc));
    let (psock, pings) = tls_calls_until_attached(&svc, &mut c);
    let n = 1500u32;
    for i in 0..n {
        c.write_all(&framed(&body(i, 1020))).unwrap();
    }
    c.flush().unwrap();
    for i in 0..n {
        assert_eq!(read_msg(&mut c), body(i, 1020), "reply {i} on {:?}", driver());
    }
    let calls = pings + u64::from(n);
    let st = eventually(|| {
        let st = svc.mux().psock_stats(psock).unwrap();
        (st.tx_msgs >= calls).then_some(st)
    });
    assert_eq!((st.tx_msgs, st.tx_bytes), (calls, 8 * pings + 1024 * u64::from(n)), "on {:?}", driver());
    assert_eq!(st.tx_addressed_drops, 0);
    assert_eq!(svc.mux().tls_stats().errors, 0);
}

/// Requests of 8 bytes, each answered with 64 KiB, to a TLS connection
/// whose client (with a 4 KiB window) reads nothing until it has sent 128
/// (8 MiB of replies, more than the socket buffers): the replies wait on
/// the psock's queue and in rustls (written on the connection's writable
/// events). All 128 arrive whole and in order.
fn big_replies_on_a_tls_connection_back_up_and_arrive_in_order() {
    use connmux::service::{Service, ServiceConfig, Verdict};
    const BIG: usize = 64 << 10;
    let p = pki();
    let cfg =
        ServiceConfig { listen: "127.0.0.1:0".parse().unwrap(), sock_type: SockType::Dgram, parser: Arc::new(l4) };
    let n = 128u32;
    // "ping" is echoed; request i is answered with reply i, 64 KiB of i
    // made beforehand (a handler this fast is answered in place).
    let replies: Vec<connmux::Bytes> =
        (0..n).map(|i| connmux::Bytes::from(framed(&(0xb16_0000 + i).to_be_bytes().repeat(BIG / 4)))).collect();
    let big = move |req: connmux::Bytes, _: connmux::PsockId, _: &mut bytes::BytesMut| {
        if &req[4..] == b"ping" {
            return Verdict::Reply(req);
        }
        let i = u32::from_be_bytes(req[4..8].try_into().unwrap()) - 0xb16_0000;
        Verdict::Reply(replies[i as usize].clone())
    };
    // (Replies the peer has not read stay within `psock_sndbuf`: not a
    // peer to abort.)
    let mux = mux_with(|c| c.core.psock_sndbuf = 16 << 20);
    let svc = Service::start_tls(mux, cfg, Arc::new(big), server_config(&p)).unwrap();
    let s = small_window_client(&svc);
    let mut c = client(&p, s);
    let (psock, pings) = tls_calls_until_attached(&svc, &mut c);
    for i in 0..n {
        c.write_all(&framed(&(0xb16_0000 + i).to_be_bytes())).unwrap();
        c.flush().unwrap();
    }
    for i in 0..n {
        let got = read_msg(&mut c);
        assert_eq!(got.len(), BIG, "reply {i} on {:?}", driver());
        assert!(got.chunks(4).all(|w| w == (0xb16_0000 + i).to_be_bytes()), "reply {i} on {:?}", driver());
    }
    let calls = pings + u64::from(n);
    let st = eventually(|| {
        let st = svc.mux().psock_stats(psock).unwrap();
        (st.tx_msgs >= calls).then_some(st)
    });
    assert_eq!((st.tx_msgs, st.tx_bytes), (calls, 8 * pings + (BIG as u64 + 4) * u64::from(n)), "on {:?}", driver());
    assert_eq!(svc.mux().tls_stats().errors, 0);
}

/// A served TLS connection sent a forged record: it fails alone, the
/// client reads the alert, the error is counted and the service lets the
/// connection go.
fn a_forged_record_on_a_served_tls_connection_fails_it() {
    let p = pki();
    let svc = tls_echo_service(&p);
    let s = tcp_client(&svc);
    let mut raw = s.try_clone().unwrap();
    let mut c = client(&p, s);
    tls_calls_until_attached(&svc, &mut c);
    let mut rec = vec![23u8, 3, 3, 0, 64];
    rec.extend((0..64u8).map(|i| i.wrapping_mul(7)));
    raw.write_all(&rec).unwrap();
    let mut b = [0u8; 16];
    let e = c.read(&mut b).expect_err("the session failed");
    assert!(e.to_string().contains("alert"), "the peer read {e:?} (no alert) on {:?}", driver());
    eventually(|| (svc.mux().psock_count() == 0).then_some(()));
    assert_eq!(svc.mux().tls_stats().errors, 1, "on {:?}", driver());
}

/// A served TLS connection whose client sends 100 requests, close_notify
/// and FIN: every reply, then the server's close_notify and FIN (the close
/// is in order as for any psock).
fn a_served_tls_connection_closes_in_order_after_a_half_close() {
    let p = pki();
    let svc = tls_echo_service(&p);
    let s = tcp_client(&svc);
    let mut c = client(&p, s);
    tls_calls_until_attached(&svc, &mut c);
    for i in 0..100 {
        c.write_all(&framed(&body(i, 100))).unwrap();
    }
    c.conn.send_close_notify();
    c.flush().unwrap();
    c.sock.shutdown(std::net::Shutdown::Write).unwrap();
    for i in 0..100 {
        assert_eq!(read_msg(&mut c), body(i, 100), "reply {i} on {:?}", driver());
    }
    let mut b = [0u8; 1];
    match c.read(&mut b) {
        Ok(0) => {}
        other => panic!("after the last reply {other:?}, not close_notify, on {:?}", driver()),
    }
    eventually(|| (svc.mux().psock_count() == 0).then_some(()));
    assert_eq!(svc.mux().tls_stats().errors, 0);
}

/// A client certificate signed by `ca` (rcgen), its chain and key.
fn client_cert(
    ca_of: &rcgen::CertifiedIssuer<'static, rcgen::KeyPair>,
    name: &str,
) -> (CertificateDer<'static>, Vec<u8>) {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.distinguished_name.push(rcgen::DnType::CommonName, name);
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    let cert = params.signed_by(&key, ca_of).unwrap();
    (cert.der().clone(), key.serialize_der())
}

/// Mutual TLS: a service whose rustls configuration asks every client for a
/// certificate its client CA signed. The handler learns who each client is
/// from `Mux::tls_peer_certificates` (it answers with the leaf's DER); a
/// client with no certificate, or with one another CA signed, fails its
/// handshake alone (counted), and the good clients lose nothing.
fn mutual_tls_tells_the_handler_who_the_client_is() {
    use connmux::service::{Service, ServiceConfig, Verdict};
    let p = pki();
    let ca_of = |cn: &str| {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.distinguished_name.push(rcgen::DnType::CommonName, cn);
        params.key_usages = vec![rcgen::KeyUsagePurpose::KeyCertSign, rcgen::KeyUsagePurpose::DigitalSignature];
        rcgen::CertifiedIssuer::self_signed(params, rcgen::KeyPair::generate().unwrap()).unwrap()
    };
    let clients_ca = ca_of("client CA");
    let strangers_ca = ca_of("another CA");
    let mut roots = rustls::RootCertStore::empty();
    roots.add(clients_ca.der().clone()).unwrap();
    let verifier =
        rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider()).build().unwrap();
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(p.key.clone()));
    let server = Arc::new(
        rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_client_cert_verifier(verifier)
            .with_single_cert(vec![p.cert.clone()], key)
            .unwrap(),
    );
    // The handler asks the service's own mux, which exists once it started.
    let mux_of_svc: Arc<std::sync::OnceLock<connmux::Mux>> = Arc::default();
    let m = mux_of_svc.clone();
    let who = move |_req: connmux::Bytes, from: connmux::PsockId, _: &mut bytes::BytesMut| {
        let chain = m.get().and_then(|m| m.tls_peer_certificates(from)).unwrap_or_default();
        let leaf = chain.first().map(|c| c.as_ref().to_vec()).unwrap_or_default();
        Verdict::Reply(connmux::Bytes::from(framed(&leaf)))
    };
    let cfg =
        ServiceConfig { listen: "127.0.0.1:0".parse().unwrap(), sock_type: SockType::Dgram, parser: Arc::new(l4) };
    let svc = Service::start_tls(mux_with(|_| {}), cfg, Arc::new(who), server).unwrap();
    let _ = mux_of_svc.set(svc.mux().clone());

    let connect = |cert: Option<&(CertificateDer<'static>, Vec<u8>)>| {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(p.ca.clone()).unwrap();
        let b = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots);
        let config = match cert {
            Some((c, k)) => b
                .with_client_auth_cert(vec![c.clone()], PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(k.clone())))
                .unwrap(),
            None => b.with_no_client_auth(),
        };
        let conn = rustls::ClientConnection::new(Arc::new(config), ServerName::try_from("localhost").unwrap()).unwrap();
        let s = TcpStream::connect(svc.local_addr()).unwrap();
        s.set_read_timeout(Some(WAIT)).unwrap();
        rustls::StreamOwned::new(conn, s)
    };
    let alice = client_cert(&clients_ca, "alice");
    let bob = client_cert(&clients_ca, "bob");
    let mallory = client_cert(&strangers_ca, "mallory");
    let (mut a, mut b) = (connect(Some(&alice)), connect(Some(&bob)));
    for _ in 0..3 {
        for (c, cert) in [(&mut a, &alice.0), (&mut b, &bob.0)] {
            c.write_all(&framed(b"who am I?")).unwrap();
            c.flush().unwrap();
            assert_eq!(read_msg(c), cert.as_ref(), "the handler saw the client's own certificate on {:?}", driver());
        }
    }
    // Refused: no certificate, and a certificate of another CA. The server
    // decides after the client's last handshake flight, so the client hears
    // of it when it reads (an alert, or the connection closed).
    for cert in [None, Some(&mallory)] {
        let mut c = connect(cert);
        let sent = c.write_all(&framed(b"let me in")).and_then(|_| c.flush());
        let mut buf = [0u8; 1];
        let got = sent.and_then(|_| c.read(&mut buf));
        assert!(matches!(got, Err(_) | Ok(0)), "refused client got {got:?} on {:?}", driver());
    }
    eventually(|| (svc.mux().tls_stats().handshake_failures == 2).then_some(()));
    // The good clients go on.
    a.write_all(&framed(b"still me")).unwrap();
    a.flush().unwrap();
    assert_eq!(read_msg(&mut a), alice.0.as_ref());
    let t = svc.mux().tls_stats();
    assert_eq!((t.handshakes, t.handshake_failures, t.errors), (2, 2, 0), "on {:?}", driver());
}

on_both_drivers!(
    many_small_records_in_one_read_are_all_received,
    mutual_tls_tells_the_handler_who_the_client_is,
    service_over_tls,
    a_forged_record_on_a_served_tls_connection_fails_it,
    a_served_tls_connection_closes_in_order_after_a_half_close,
    big_replies_on_a_tls_connection_back_up_and_arrive_in_order,
    a_served_tls_connection_counts_its_calls_once,
    a_served_tls_connection_takes_sends_from_elsewhere_and_split_messages,
    a_slow_reader_of_a_tls_connection_gets_every_reply_in_order,
    service_closes_in_order_after_a_half_close,
    server_frames_decrypted_messages_both_ways,
    messages_wait_for_the_handshake,
    client_psock_to_a_rustls_server,
    bad_peers_fail_alone,
    forged_record_after_the_handshake,
    close_notify_between_and_inside_messages,
    backpressure_loses_nothing,
    end_after_backpressure_comes_after_the_last_message,
    unattach_closes_the_connection,
);
