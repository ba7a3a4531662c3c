// Package paperplot draws the figures of `make bench-paper` as PNG files
// with gonum.org/v1/plot, in the shape of the paper's: migration time and
// downtime against the producer's rate per strategy (its Figs 5-8), the
// strategies side by side at one rate (Figs 9-11), and the phases of a
// migration stacked per rate (Figs 12-14). It is pure: runs in, PNG files
// out, with no cluster, broker or clock; the series functions that the
// figures are drawn from are exported so that tests can check the mapping.
package paperplot
