//! `connmux`: one command with subcommands for the servers, the load generators
//! and the tools.

use clap::{Parser, Subcommand};

mod cmd;

/// The system allocator, counting large blocks in use: the servers trim
/// the allocator when that count falls (`cmd::server`'s `Trimmer`).
#[global_allocator]
static ALLOC: connmux_sys::malloc::Counting = connmux_sys::malloc::Counting;

#[derive(Parser)]
#[command(name = "connmux", version, about = "Message-based interface over TCP: servers, load generators and tools", long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// The main job: the RPC server driven by rpctest on loopback, beside a
    /// thread-per-connection baseline; prints RPC/s, median RTT and ratios.
    Demo(cmd::demo::Args),
    /// Run the echo server (byte echo or message echo). SIGTERM, SIGINT and
    /// SIGHUP stop it gracefully (see --grace-ms).
    EchoServer(cmd::server::EchoArgs),
    /// Run the ONC RPC server answering NULL calls (NFS v3/v4 by default).
    /// SIGTERM, SIGINT and SIGHUP stop it gracefully (see --grace-ms).
    RpcServer(cmd::server::RpcArgs),
    /// Run the 9P2000.L file server exporting one directory.
    #[command(name = "9p-server")]
    NinepServer(cmd::ninep::Args),
    /// Run the NFS version 3 server (with MOUNT version 3 on the same port)
    /// exporting one directory.
    #[command(name = "nfs-server")]
    NfsServer(cmd::nfs::Args),
    /// Load generator for 9P2000.L servers: getattr, walk+clunk, reads.
    #[command(name = "9ptest")]
    Ninetest(cmd::ninep::loadtest::Args),
    /// Load generator for the echo server: median RTT and messages/s.
    Echotest(cmd::echotest::Args),
    /// Load generator for the RPC server: median RTT and RPC/s.
    Rpctest(cmd::rpctest::Args),
    /// Show the statistics of running connmux servers (as /proc/net/kcm does).
    Stat(cmd::stat::Args),
    /// Split a byte stream into messages with a built-in or BPF parser.
    Parse(cmd::parse::Args),
    Bench(cmd::bench::Args),
}

fn main() {
    cmd::pipe::install();
    let cli = Cli::parse();
    if matches!(
        cli.command,
        Command::EchoServer(_) | Command::RpcServer(_) | Command::NinepServer(_) | Command::NfsServer(_)
    ) {
        // Before any thread starts: every thread inherits the mask, and the
        // main thread takes the stop signals (see cmd::stop).
        if let Err(e) = cmd::stop::block() {
            eprintln!("connmux: stop signals not handled: {e:#}");
        }
    }
    // (Unwound, not aborted, so that a closed standard output still stops
    // what the command started: `cmd::pipe::install`.)
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| match cli.command {
        Command::Demo(a) => cmd::demo::run(a),
        Command::EchoServer(a) => cmd::server::run_echo(a),
        Command::RpcServer(a) => cmd::server::run_rpc(a),
        Command::NinepServer(a) => cmd::ninep::run(a),
        Command::NfsServer(a) => cmd::nfs::run(a),
        Command::Ninetest(a) => cmd::ninep::loadtest::run(a),
        Command::Echotest(a) => cmd::echotest::run(a),
        Command::Rpctest(a) => cmd::rpctest::run(a),
        Command::Stat(a) => cmd::stat::run(a),
        Command::Parse(a) => cmd::parse::run(a),
        Command::Bench(a) => cmd::bench::run(a),
    }))
    .unwrap_or_else(|payload| cmd::pipe::unwound(payload));
    match r {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            if cmd::pipe::is_broken_pipe(&e) && cmd::pipe::closed() {
                cmd::pipe::die();
            }
            eprintln!("connmux: {e:#}");
            std::process::exit(1);
        }
    }
}
