package main

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"os"
	"regexp"
	"strings"
)

// functionLogs holds the process's standard output and error while the demo's functions run:
// their log lines, and any other line written there, go to a file instead of between the
// report's lines.
type functionLogs struct {
	f              *os.File
	stdout, stderr *os.File
	logOutput      io.Writer
}

// captureLogs points os.Stdout, os.Stderr and the log package at a new temporary file. The
// report's writers, taken before, still reach the terminal.
func captureLogs() (*functionLogs, error) {
	f, err := os.CreateTemp("", "couponctl-functions-*.log")
	if err != nil {
		return nil, fmt.Errorf("log file: %w", err)
	}
	l := &functionLogs{f: f, stdout: os.Stdout, stderr: os.Stderr, logOutput: log.Writer()}
	log.SetOutput(f)
	os.Stdout, os.Stderr = f, f
	return l, nil
}

// restore gives the process its standard streams back; writers that took the file keep it until
// finish.
func (l *functionLogs) restore() {
	os.Stdout, os.Stderr = l.stdout, l.stderr
	log.SetOutput(l.logOutput)
}

// discard gives the process its standard streams back and removes the log file: nothing ran.
func (l *functionLogs) discard() {
	l.restore()
	_ = l.f.Close()
	_ = os.Remove(l.f.Name())
}

// finish closes the log file and tells w where it is, with its lines by level, counted by
// [logLevel] from the lines the file holds, and note on what to expect in them.
func (l *functionLogs) finish(w io.Writer, note string) {
	_ = l.f.Close()
	b, err := os.ReadFile(l.f.Name())
	if err != nil {
		return
	}
	var lines []string
	if len(b) > 0 {
		lines = strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	}
	fmt.Fprintf(w, "\nFunction logs: %s (%d lines: %s%s)\n", l.f.Name(), len(lines), countLevels(lines), note)
}

// countLevels counts lines by [logLevel]: ERROR, WARN and INFO always, DEBUG and the lines
// without a level when there are any, so that the counts add up to the lines.
func countLevels(lines []string) string {
	levels := map[string]int{}
	for _, line := range lines {
		levels[logLevel(line)]++
	}
	s := fmt.Sprintf("%d ERROR, %d WARN, %d INFO", levels["ERROR"], levels["WARN"], levels["INFO"])
	if n := levels["DEBUG"]; n > 0 {
		s += fmt.Sprintf(", %d DEBUG", n)
	}
	if n := levels[""]; n > 0 {
		s += fmt.Sprintf(", %d without a level", n)
	}
	return s
}

// slogDefaultLine is a line of slog's default logger, which writes through the log package:
// "2026/09/21 10:00:00 WARN msg key=value" (log's date and time flags; a level such as INFO+2
// is printed with its offset).
var slogDefaultLine = regexp.MustCompile(`^\d{4}/\d{2}/\d{2} \d{2}:\d{2}:\d{2}(?:\.\d+)? (DEBUG|INFO|WARN|ERROR)(?:[+-]\d+)? `)

// slogTextLevel is the level of a line of slog's TextHandler: "time=... level=WARN msg=...".
var slogTextLevel = regexp.MustCompile(`(?:^| )level=(DEBUG|INFO|WARN|ERROR)(?:[+-]\d+)?(?: |$)`)

// logLevel is the level of one line of the demo's log file, ERROR, WARN, INFO or DEBUG, or ""
// for a line without one (a plain line, such as the functions framework's "Serving function"
// lines when it serves). The file holds
// the functions' lines in the shape telemetry gives them: JSON with Cloud Logging's "severity"
// (or slog's "level") when telemetry is set up, slog's default text lines through the log
// package when it is off (--telemetry=off), and the log package's own lines.
func logLevel(line string) string {
	var v struct {
		Level    string `json:"level"`
		Severity string `json:"severity"`
	}
	var level string
	if strings.HasPrefix(line, "{") && json.Unmarshal([]byte(line), &v) == nil {
		level = strings.ToUpper(cmp.Or(v.Severity, v.Level))
		level, _, _ = strings.Cut(level, "+") // slog's ERROR+2
		level, _, _ = strings.Cut(level, "-")
	} else if m := slogDefaultLine.FindStringSubmatch(line); m != nil {
		level = m[1]
	} else if m := slogTextLevel.FindStringSubmatch(line); m != nil {
		level = m[1]
	}
	switch level {
	case "WARNING":
		return "WARN"
	case "CRITICAL", "ALERT", "EMERGENCY": // Cloud Logging's severities above ERROR
		return "ERROR"
	case "NOTICE":
		return "INFO"
	case "DEFAULT":
		return ""
	}
	return level
}
