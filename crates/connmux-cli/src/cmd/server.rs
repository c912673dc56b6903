//! (being implemented)
#[derive(clap::Args, Debug)]
pub struct EchoArgs {}
#[derive(clap::Args, Debug)]
pub struct RpcArgs {}

pub fn run_echo(_a: EchoArgs) -> anyhow::Result<i32> {
    anyhow::bail!("not implemented yet")
}
pub fn run_rpc(_a: RpcArgs) -> anyhow::Result<i32> {
    anyhow::bail!("not implemented yet")
}
