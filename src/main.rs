//! The `berth` binary: parses arguments and runs a command. All the work is
//! in the library; see `cli`.

mod cli;

use clap::Parser;

fn main() {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info"))
        .format_timestamp_millis()
        .init();
    let args = cli::args::Cli::parse();
    let code = match cli::commands::run(args) {
        Ok(()) => cli::EXIT_OK,
        Err(e) => {
            eprintln!("berth: {e}");
            e.code
        }
    };
    std::process::exit(code);
}
