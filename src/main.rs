//! The `berth` binary: parses arguments and runs a command. All the work is
//! in the library; see `cli`.

mod cli;

/// mimalloc (`berth run` tunes it with `berth::alloc::tune`: see there why).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use clap::{FromArgMatches, parser::ValueSource};

fn main() {
    // Before anything allocates much (see `berth::alloc`).
    berth::alloc::no_huge_pages();
    // First, while no other thread exists (see notify::take_env).
    cli::notify::take_env();
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info"))
        .format_timestamp_millis()
        .init();
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let matches = cli::args::parse(&argv).unwrap_or_else(|e| explain_and_exit(e, &argv));
    // `berth run` takes its data dir from the config unless one is given here.
    let data_dir_from = match matches.value_source("data_dir") {
        Some(ValueSource::CommandLine) => Some("--data-dir"),
        Some(ValueSource::EnvVariable) => Some("BERTH_DATA_DIR"),
        _ => None,
    };
    let args = match cli::args::Cli::from_arg_matches(&matches) {
        Ok(a) => a,
        Err(e) => explain_and_exit(e, &argv),
    };
    let dir = args.data_dir.clone();
    // sled panics on some damaged pages when it reads them: that is a
    // damaged data dir, said as such; any other panic is a bug of berth's.
    let result = berth::store::catch_panic(|| cli::commands::run(args, data_dir_from))
        .unwrap_or_else(|panic| Err(cli::panic_error(&dir, panic)));
    let code = match result {
        Ok(()) => cli::EXIT_OK,
        Err(e) => {
            // Not eprintln!, which panics when stderr cannot be written
            // (a log file on a full disk): the exit code says it all then.
            use std::io::Write;
            let _ = writeln!(std::io::stderr(), "berth: {e}");
            e.code
        }
    };
    std::process::exit(code);
}

/// Exits on an argument error: with clap's message, or a clearer one
/// (`cli::args::explain`), exit code 2 either way (clap's for a bad usage;
/// `--help` and `--version` exit 0 through clap).
fn explain_and_exit(e: clap::Error, args: &[std::ffi::OsString]) -> ! {
    match cli::args::explain(&e, args, |name: &str| std::env::var_os(name)) {
        Some(message) => {
            use std::io::Write;
            let _ = writeln!(
                std::io::stderr(),
                "error: {message}\n\nFor more information, try '--help'."
            );
            std::process::exit(2);
        }
        None => e.exit(),
    }
}
