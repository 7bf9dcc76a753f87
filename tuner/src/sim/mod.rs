//! A simulated landscape for testing the engine's search logic (tests and `bench/search-sim` only).
