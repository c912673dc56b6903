//! One module per subcommand; each has an `Args` (clap) and a `run` returning the
//! process exit code.
pub mod baseline;
pub mod bench;
pub mod demo;
pub mod echotest;
pub mod loadgen;
pub mod nfs;
pub mod ninep;
pub mod parse;
pub mod pipe;
pub mod rpcbind;
pub mod rpctest;
pub mod rpctest_mux;
pub mod server;
pub mod stat;
pub mod stop;
pub mod tls;
