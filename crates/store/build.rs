//! `sqlx::migrate!` embeds the migrations: rebuild when one is added or removed, not only when
//! one that was embedded changes.

fn main() {
    println!("cargo:rerun-if-changed=../../migrations");
}
