// keypair-oracle: the differential oracle of certrotor's key check (issue 30.4). For each line
// "CERT_FILE KEY_FILE" on stdin it prints one line: "OK" when Go's crypto/tls.X509KeyPair (how
// kube-apiserver and etcd load a serving or client pair) loads the pair, else "ERR <reason>".
// Built by the integration tests with Debian's Go (golang-go), standard library only.
package main

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"os"
	"strings"
)

func main() {
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<20)
	out := bufio.NewWriter(os.Stdout)
	defer out.Flush()
	for in.Scan() {
		fields := strings.Fields(in.Text())
		if len(fields) != 2 {
			fmt.Fprintf(out, "ERR usage: CERT_FILE KEY_FILE\n")
			continue
		}
		cert, err := os.ReadFile(fields[0])
		if err != nil {
			fmt.Fprintf(out, "ERR %s\n", oneLine(err.Error()))
			continue
		}
		key, err := os.ReadFile(fields[1])
		if err != nil {
			fmt.Fprintf(out, "ERR %s\n", oneLine(err.Error()))
			continue
		}
		if _, err := tls.X509KeyPair(cert, key); err != nil {
			fmt.Fprintf(out, "ERR %s\n", oneLine(err.Error()))
			continue
		}
		fmt.Fprintln(out, "OK")
	}
	if err := in.Err(); err != nil {
		fmt.Fprintf(os.Stderr, "keypair-oracle: reading stdin: %v\n", err)
		os.Exit(2)
	}
}

func oneLine(s string) string {
	return strings.ReplaceAll(s, "\n", " ")
}
