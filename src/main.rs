//! The `berth` binary: parses arguments and runs a command. All the work is
//! in the library; see `cli`.

mod cli;

/// mimalloc (`berth run` tunes it with `berth::alloc::tune`: see there why).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use clap::{CommandFactory, FromArgMatches, parser::ValueSource};

fn main() {
    // Before anything allocates much (see `berth::alloc`).
    berth::alloc::no_huge_pages();
    // First, while no other thread exists (see notify::take_env).
    cli::notify::take_env();
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info"))
        .format_timestamp_millis()
        .init();
    let matches = cli::args::Cli::command().get_matches();
    // `berth run` takes its data dir from the config unless one is given here.
    let data_dir_given = matches!(
        matches.value_source("data_dir"),
        Some(ValueSource::CommandLine | ValueSource::EnvVariable)
    );
    let args = match cli::args::Cli::from_arg_matches(&matches) {
        Ok(a) => a,
        Err(e) => e.exit(),
    };
    let dir = args.data_dir.clone();
    // sled panics on some damaged pages when it reads them: that is a
    // damaged data dir, said as such; any other panic is a bug of berth's.
    let result = berth::store::catch_panic(|| cli::commands::run(args, data_dir_given))
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
