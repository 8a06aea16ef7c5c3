// CoreDNS with only the plugins the kube tier's cluster DNS uses, built from the Go module
// proxy: health answers the tier's readiness check, the kubernetes plugin answers
// *.svc.cluster.local from the API server, forward sends every other name to the host's
// resolvers. Directive order is CoreDNS's plugin.cfg.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/forward"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/log"
)

func init() {
	dnsserver.Directives = []string{"bind", "health", "errors", "log", "cache", "kubernetes", "forward"}
}

func main() {
	coremain.Run()
}
