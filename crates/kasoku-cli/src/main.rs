//! The `kasoku` command-line tool: run a model (one prompt or an interactive chat), print
//! logits for reference checks, inspect a checkpoint, fetch known models.

mod args;
mod progress;

use kasoku::fetch;

use anyhow::Result;
use clap::Parser;

fn main() {
    let cli = args::Cli::parse();
    if let Err(err) = run(cli) {
        eprintln!("error: {err:#}");
        std::process::exit(1);
    }
}

fn run(cli: args::Cli) -> Result<()> {
    match cli.command {
        args::Command::Fetch { names, list } => {
            if list || names.is_empty() {
                for m in fetch::KNOWN_MODELS {
                    println!("{:<20} {:<45} {}", m.name, m.file, m.description);
                }
                return Ok(());
            }
            for name in names {
                println!("{}", progress::resolve_model(&name, false)?.display());
            }
            Ok(())
        }
        _ => anyhow::bail!("not implemented yet"),
    }
}
