package benchproc

// Cleanup undoes a bench's set-up: the steps added, last first.
type Cleanup struct{ steps []func() }

// Add adds a step, run before every step added earlier.
func (c *Cleanup) Add(step func()) { c.steps = append(c.steps, step) }

// Run runs the steps, last added first, and forgets them.
func (c *Cleanup) Run() {
	for i := len(c.steps) - 1; i >= 0; i-- {
		c.steps[i]()
	}
	c.steps = nil
}
