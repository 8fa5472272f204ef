package report

import (
	"fmt"
	"image/color"
	"math"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"

	"github.com/dtimer/dtimer/benchmark/internal/workload"
)

// palette keeps one color per system across every plot.
var palette = []color.Color{
	color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 255}, color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 255},
	color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 255}, color.RGBA{R: 0xff, G: 0x7f, B: 0x0e, A: 255},
	color.RGBA{R: 0x94, G: 0x67, B: 0xbd, A: 255}, color.RGBA{R: 0x8c, G: 0x56, B: 0x4b, A: 255},
	color.RGBA{R: 0xe3, G: 0x77, B: 0xc2, A: 255}, color.RGBA{R: 0x7f, G: 0x7f, B: 0x7f, A: 255},
	color.RGBA{R: 0xbc, G: 0xbd, B: 0x22, A: 255}, color.RGBA{R: 0x17, G: 0xbe, B: 0xcf, A: 255},
}

type colors map[string]color.Color

func (c colors) of(system string) color.Color {
	if col, ok := c[system]; ok {
		return col
	}
	col := palette[len(c)%len(palette)]
	c[system] = col
	return col
}

// floorMs keeps lateness positive on the log axis; anything below is drawn
// at it.
const floorMs = 0.1

// Plots writes, per firing workload, a lateness CDF and a fired-per-second
// plot comparing the systems, into dir, and returns the file names by
// workload key.
func Plots(dir string, results []*workload.Result) (map[string][]string, error) {
	groups := map[string][]*workload.Result{}
	for _, r := range results {
		if r.Fired == 0 || len(r.CDF) == 0 {
			continue
		}
		k := Key(r)
		groups[k] = append(groups[k], r)
	}
	keys := make([]string, 0, len(groups))
	for k := range groups {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	cols := colors{}
	out := map[string][]string{}
	for _, k := range keys {
		rs := groups[k]
		sort.SliceStable(rs, func(i, j int) bool { return order(rs[i].System) < order(rs[j].System) })
		base := strings.NewReplacer("/", "-", " ", "").Replace(k)
		cdfFile := "lateness-cdf-" + base + ".png"
		if err := cdfPlot(filepath.Join(dir, cdfFile), k, rs, cols); err != nil {
			return nil, err
		}
		rateFile := "fired-per-second-" + base + ".png"
		if err := ratePlot(filepath.Join(dir, rateFile), k, rs, cols); err != nil {
			return nil, err
		}
		out[k] = []string{cdfFile, rateFile}
	}
	return out, nil
}

func cdfPlot(path, title string, rs []*workload.Result, cols colors) error {
	p := plot.New()
	p.Title.Text = "Firing lateness CDF: " + title
	p.X.Label.Text = "lateness (ms, log scale): callback arrival - executeAt"
	p.Y.Label.Text = "fraction of timers"
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = logTicks{}
	p.Y.Min, p.Y.Max = 0, 1
	p.Legend.Top, p.Legend.Left = false, false
	p.Add(plotter.NewGrid())
	for _, r := range rs {
		pts := make(plotter.XYs, 0, len(r.CDF))
		for _, c := range r.CDF {
			pts = append(pts, plotter.XY{X: math.Max(c.Ms, floorMs), Y: c.Fraction})
		}
		l, err := plotter.NewLine(pts)
		if err != nil {
			return err
		}
		l.Color = cols.of(r.System)
		l.Width = vg.Points(1.5)
		p.Add(l)
		p.Legend.Add(fmt.Sprintf("%s (p99 %s)", r.System, ms(r.Lateness.P99)), l)
	}
	return p.Save(9*vg.Inch, 5*vg.Inch, path)
}

func ratePlot(path, title string, rs []*workload.Result, cols colors) error {
	p := plot.New()
	p.Title.Text = "Fired per second: " + title
	p.X.Label.Text = "seconds since the first due time (backlog: since the restart)"
	p.Y.Label.Text = "timers fired (first callbacks) per second"
	p.Add(plotter.NewGrid())
	for _, r := range rs {
		pts := make(plotter.XYs, 0, len(r.Series))
		for _, s := range r.Series {
			pts = append(pts, plotter.XY{X: float64(s.At) + 0.5, Y: float64(s.Count)})
		}
		if len(pts) == 0 {
			continue
		}
		l, sc, err := plotter.NewLinePoints(pts)
		if err != nil {
			return err
		}
		l.Color = cols.of(r.System)
		sc.Color = l.Color
		sc.Shape = draw.CircleGlyph{}
		sc.Radius = vg.Points(1.5)
		p.Add(l, sc)
		p.Legend.Add(r.System, l)
	}
	p.Y.Min = 0
	return p.Save(9*vg.Inch, 5*vg.Inch, path)
}

// logTicks labels 1-2-5 steps of every decade in range; gonum's LogTicks
// labels only powers of ten, too few for lateness that spans two decades.
type logTicks struct{}

func (logTicks) Ticks(lo, hi float64) []plot.Tick {
	var ts []plot.Tick
	for d := math.Pow(10, math.Floor(math.Log10(lo))); d <= hi; d *= 10 {
		for _, m := range []float64{1, 2, 5} {
			v := d * m
			if v < lo || v > hi {
				continue
			}
			ts = append(ts, plot.Tick{Value: v, Label: strconv.FormatFloat(v, 'g', -1, 64)})
		}
	}
	return ts
}
