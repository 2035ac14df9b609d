package image

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
)

// AptSource is one `deb` entry of apt's configuration.
type AptSource struct {
	URI        string
	Suites     []string
	Components []string
	File       string // where it was configured
}

// ReadAptSources reads the deb entries configured under etcApt (normally
// /etc/apt): sources.list and sources.list.d/*.list in the one-line format,
// sources.list.d/*.sources in the deb822 format. Disabled entries and
// deb-src are left out.
func ReadAptSources(etcApt string) ([]AptSource, error) {
	files := []string{filepath.Join(etcApt, "sources.list")}
	more, err := filepath.Glob(filepath.Join(etcApt, "sources.list.d", "*"))
	if err != nil {
		return nil, err
	}
	sort.Strings(more)
	files = append(files, more...)
	var out []AptSource
	for _, f := range files {
		var parse func(string, string) []AptSource
		switch {
		case strings.HasSuffix(f, ".list"):
			parse = parseOneLine
		case strings.HasSuffix(f, ".sources"):
			parse = parseDeb822
		default:
			continue
		}
		b, err := os.ReadFile(f)
		if os.IsNotExist(err) {
			continue
		} else if err != nil {
			return nil, fmt.Errorf("read apt sources: %w", err)
		}
		out = append(out, parse(f, string(b))...)
	}
	return out, nil
}

// parseOneLine parses `deb [opts] URI SUITE [COMPONENT...]` lines.
func parseOneLine(file, text string) []AptSource {
	var out []AptSource
	for _, line := range strings.Split(text, "\n") {
		if i := strings.IndexByte(line, '#'); i >= 0 {
			line = line[:i]
		}
		f := strings.Fields(line)
		if len(f) < 3 || f[0] != "deb" {
			continue
		}
		f = f[1:]
		if strings.HasPrefix(f[0], "[") { // options, possibly several fields
			for len(f) > 0 && !strings.HasSuffix(f[0], "]") {
				f = f[1:]
			}
			if len(f) > 0 {
				f = f[1:]
			}
		}
		if len(f) < 2 {
			continue
		}
		out = append(out, AptSource{URI: f[0], Suites: f[1:2], Components: f[2:], File: file})
	}
	return out
}

// parseDeb822 parses paragraphs of Types/URIs/Suites/Components fields.
func parseDeb822(file, text string) []AptSource {
	var out []AptSource
	flush := func(p map[string]string) {
		if !slices.Contains(strings.Fields(p["types"]), "deb") || strings.EqualFold(p["enabled"], "no") {
			return
		}
		for _, uri := range strings.Fields(p["uris"]) {
			out = append(out, AptSource{URI: uri, Suites: strings.Fields(p["suites"]), Components: strings.Fields(p["components"]), File: file})
		}
	}
	p := map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.TrimSpace(line) == "":
			flush(p)
			p = map[string]string{}
		case strings.HasPrefix(line, "#"), line[0] == ' ', line[0] == '\t':
			// comment, or the continuation of a multi-line field (Signed-By keys)
		default:
			if k, v, ok := strings.Cut(line, ":"); ok {
				p[strings.ToLower(strings.TrimSpace(k))] = strings.TrimSpace(v)
			}
		}
	}
	flush(p)
	return out
}

// Mirror finds the archive URI apt uses for suite's main component.
func Mirror(sources []AptSource, suite string) (string, error) {
	for _, s := range sources {
		if !slices.Contains(s.Suites, suite) || !slices.Contains(s.Components, "main") {
			continue
		}
		if strings.HasPrefix(s.URI, "http://") || strings.HasPrefix(s.URI, "https://") || strings.HasPrefix(s.URI, "file:/") {
			return strings.TrimSuffix(s.URI, "/"), nil
		}
	}
	return "", fmt.Errorf("no apt source for %q main (http, https or file) in apt's configuration; add one to /etc/apt/sources.list.d", suite)
}

// HostSuite is the Debian codename of this machine (VERSION_CODENAME in
// os-release).
func HostSuite(osRelease string) (string, error) {
	b, err := os.ReadFile(osRelease)
	if err != nil {
		return "", fmt.Errorf("find the host's Debian release: %w", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VERSION_CODENAME="); ok && strings.Trim(v, `"'`) != "" {
			return strings.Trim(v, `"'`), nil
		}
	}
	return "", fmt.Errorf("%s has no VERSION_CODENAME; pass the suite explicitly", osRelease)
}
