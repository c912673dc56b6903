//! Backend choice through the public API, on the kernel this runs on: `Auto`
//! takes AF_KCM where it exists and the userspace runtime elsewhere;
//! `Backend::Kernel` without AF_KCM is a typed error, not a silent fallback.
//! (The kernel backend itself runs in the kcmvm VM: `scripts/conformance.sh`,
//! cases 44-46 and every §7 case through `connmux::Mux`.)

use std::io::{self, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

use connmux::{Backend, BackendError, BpfProgram, Config, KernelMux, Mux, SockType};

fn pair() -> (TcpStream, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    let (s, _) = l.accept().unwrap();
    (c, s)
}

fn frame(body: &[u8]) -> Vec<u8> {
    let mut m = (body.len() as u32).to_be_bytes().to_vec();
    m.extend_from_slice(body);
    m
}

fn config(backend: Backend) -> Config {
    Config { backend, placement: connmux::Placement::Unpinned, ..Config::default() }
}

#[test]
fn default_is_userspace() {
    assert_eq!(Config::default().backend, Backend::Userspace);
    let m = Mux::new(Config { placement: connmux::Placement::Unpinned, ..Config::default() }).unwrap();
    assert_eq!(m.backend(), Backend::Userspace);
    assert!(m.workers() >= 1);
    assert!(m.kernel().is_none());
}

#[test]
fn auto_takes_the_kernel_only_where_af_kcm_exists() {
    let m = Mux::new(config(Backend::Auto)).unwrap();
    let want = if KernelMux::supported() { Backend::Kernel } else { Backend::Userspace };
    assert_eq!(m.backend(), want);
    // Whichever it took carries a message.
    let s = m.socket(SockType::Dgram).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let (mut peer, conn) = pair();
    m.attach(&conn, connmux::parsers::from_spec("l4").unwrap()).unwrap();
    peer.write_all(&frame(b"auto")).unwrap();
    let mut b = [0u8; 32];
    let n = s.recv(&mut b).unwrap();
    assert_eq!(&b[..n], &frame(b"auto")[..]);
}

#[test]
fn kernel_without_af_kcm_is_a_typed_error() {
    match Mux::new(config(Backend::Kernel)) {
        Ok(m) => {
            assert!(KernelMux::supported(), "a kernel mux without AF_KCM");
            assert_eq!(m.backend(), Backend::Kernel);
            assert_eq!(m.workers(), 0);
        }
        Err(e) => {
            assert!(!KernelMux::supported(), "Backend::Kernel failed with AF_KCM here: {e}");
            assert_eq!(e.kind(), io::ErrorKind::Unsupported);
            match BackendError::of(&e) {
                Some(BackendError::KernelUnavailable(why)) => assert_eq!(why.raw_os_error(), Some(libc::EAFNOSUPPORT)),
                other => panic!("not KernelUnavailable: {other:?}"),
            }
            let text = e.to_string();
            assert!(text.contains("AF_KCM is not available") && text.contains("Backend::Userspace"), "{text}");
        }
    }
}

/// `attach_bpf` on the userspace backend: the textbook `ld_abs_w[0] + 4` runs
/// from each message's start, so two messages in one write are framed right.
#[test]
fn attach_bpf_frames_from_the_message_start() {
    let m = Mux::new(config(Backend::Userspace)).unwrap();
    let s = m.socket(SockType::Dgram).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let (mut peer, conn) = pair();
    let code: Vec<u8> = [
        [0xbf, 0x16, 0, 0, 0, 0, 0, 0], // r6 = r1
        [0x20, 0, 0, 0, 0, 0, 0, 0],    // r0 = ld_abs_w[0]
        [0x07, 0, 0, 0, 4, 0, 0, 0],    // r0 += 4
        [0x95, 0, 0, 0, 0, 0, 0, 0],    // exit
    ]
    .concat();
    m.attach_bpf(&conn, &BpfProgram::Bytecode(code)).unwrap();
    let mut w = frame(b"ab");
    w.extend(frame(b"0123456789"));
    peer.write_all(&w).unwrap();
    let mut b = [0u8; 64];
    let n = s.recv(&mut b).unwrap();
    assert_eq!(&b[..n], &frame(b"ab")[..]);
    let n = s.recv(&mut b).unwrap();
    assert_eq!(&b[..n], &frame(b"0123456789")[..]);
    // A program that does not load is InvalidInput, not a panic.
    let (_p2, conn2) = pair();
    let e = m.attach_bpf(&conn2, &BpfProgram::Bytecode(vec![1, 2, 3])).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
}
