"""A step's attempts: claiming them, executing the function, keeping the lease while it
runs, and the step's own timeout."""
