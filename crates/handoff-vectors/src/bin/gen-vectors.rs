//! Writes the wire-format test vectors to `spec/vectors/` (or the folder given as the first argument).

fn main() {
    let dir = std::env::args_os()
        .nth(1)
        .map(std::path::PathBuf::from)
        .unwrap_or_else(handoff_vectors::vectors_dir);
    match handoff_vectors::write_all(&dir) {
        Ok(n) => println!("wrote {n} vectors to {}", dir.display()),
        Err(e) => {
            eprintln!("error: cannot write vectors to {}: {e}", dir.display());
            std::process::exit(1);
        }
    }
}
