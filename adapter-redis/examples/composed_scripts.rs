//! Writes every script as `SCRIPT LOAD` sends it, composed from the Lua
//! files and the algorithm registry, into a directory:
//! `composed_scripts <dir> <prefix>` writes `<prefix><tag>.lua` for each
//! algorithm's single-key script (its tag byte: `F`, `S`, ...),
//! `<prefix>P.lua` for the set driver, `<prefix>R.lua` for the release and
//! `<prefix>U.lua` for the settle of usage.
//! `scripts/bench-scripts.sh` measures this tree's scripts from these
//! files.

use adapter_redis::ScriptKind;

fn main() -> std::io::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let (Some(dir), Some(prefix)) = (args.get(1), args.get(2)) else {
        eprintln!("usage: composed_scripts <dir> <prefix>");
        std::process::exit(2);
    };
    for kind in ScriptKind::ALL {
        let name = match kind {
            ScriptKind::Single(algorithm) => char::from(algorithm.tag()),
            ScriptKind::PolicySet => 'P',
            ScriptKind::Release => 'R',
            ScriptKind::Settle => 'U',
        };
        std::fs::write(format!("{dir}/{prefix}{name}.lua"), kind.source())?;
    }
    Ok(())
}
