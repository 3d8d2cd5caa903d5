//! The `kasoku` command-line tool: run a model (one prompt or an interactive chat), print
//! logits for reference checks, inspect a checkpoint, fetch known models.

mod args;
mod bench;
mod bench_client;
mod draft_gpu;
mod inspect;
mod logits;
mod progress;
mod quantize;
mod run;
mod run_gpu;
mod serve;
mod spec_args;

use kasoku_fetch as fetch;

use anyhow::Result;
use clap::Parser;

fn main() {
    let cli = args::Cli::parse();
    if let Err(err) = run(cli) {
        eprintln!("error: {err:#}");
        std::process::exit(1);
    }
}

/// `kasoku fetch --verify`: one line per cached model and leftover, then a summary.
fn verify_cache() -> Result<()> {
    eprintln!("re-hashing the models in {}", fetch::models_dir().display());
    let report = fetch::verify()?;
    for path in &report.ok {
        println!("ok       {}", path.display());
    }
    for (path, got) in &report.corrupt {
        println!(
            "corrupt  {} (sha256 {got}; removed, fetched again on next use)",
            path.display()
        );
    }
    for path in &report.leftovers {
        println!("removed  {} (left by an interrupted fetch)", path.display());
    }
    println!(
        "{} ok, {} corrupt, {} leftovers removed",
        report.ok.len(),
        report.corrupt.len(),
        report.leftovers.len()
    );
    anyhow::ensure!(
        report.corrupt.is_empty(),
        "{} cached model(s) were corrupt and have been removed",
        report.corrupt.len()
    );
    Ok(())
}

fn run(cli: args::Cli) -> Result<()> {
    match cli.command {
        args::Command::Fetch {
            names,
            list,
            verify,
        } => {
            if verify {
                return verify_cache();
            }
            if list || names.is_empty() {
                for m in fetch::KNOWN_MODELS {
                    println!("{:<26} {:<45} {}", m.name, m.file, m.description);
                }
                for d in fetch::KNOWN_DRAFTERS {
                    let place = format!("drafters/{} (shipped)", d.name);
                    println!("{:<26} {:<45} {}", d.name, place, d.description);
                }
                return Ok(());
            }
            for name in names {
                println!("{}", progress::resolve_model(&name, false)?.display());
            }
            Ok(())
        }
        args::Command::Inspect { path, tensors } => {
            let path = progress::resolve_model(&path, false)?;
            inspect::inspect(&path, tensors)
        }
        args::Command::Bench(mut args) => {
            args.spec.resolve_shipped(&args.model)?;
            bench::bench(&args)
        }
        args::Command::Run(mut args) => {
            let model = args.model_name().to_string();
            args.spec.resolve_shipped(&model)?;
            run::run(&args)
        }
        args::Command::Serve(mut args) => {
            args.spec.resolve_shipped(&args.model)?;
            serve::serve(&args)
        }
        args::Command::BenchClient(args) => bench_client::bench_client(&args),
        args::Command::Quantize(args) => quantize::quantize(&args),
        args::Command::Logits {
            model,
            tokens,
            threads,
            device,
        } => logits::logits(&model, &tokens, threads, device),
    }
}
