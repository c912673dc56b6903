//! (being implemented)
#[derive(clap::Args, Debug)]
pub struct Args {}

pub fn run(_a: Args) -> anyhow::Result<i32> {
    anyhow::bail!("not implemented yet")
}
