// Placeholder until the CPU runtime lands.
