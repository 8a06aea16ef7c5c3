// The pod sandbox process (dwell.local/pause): standard library only.
module dwell.local/kube/pause

go 1.24.0
