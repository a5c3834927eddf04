#!/usr/bin/env bash
# Checks that another module can import netop's generated clientset without
# copying the replace directives that netop's own go.mod needs for
# k8s.io/kubernetes (replace directives only apply in the main module).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
module=$(cd "$root" && go list -m)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

cat > "$tmp/go.mod" <<EOM
module example.com/netop-consumer

go 1.26.0

require $module v0.0.0

// Only netop itself is replaced, because it is not published from here.
replace $module => $root
EOM
cat > "$tmp/main.go" <<EOM
package main

import (
	"fmt"

	"k8s.io/client-go/rest"

	"$module/pkg/generated/clientset/versioned"
	informers "$module/pkg/generated/informers/externalversions"
)

func main() {
	client, err := versioned.NewForConfig(&rest.Config{Host: "https://127.0.0.1:1"})
	if err != nil {
		panic(err)
	}
	factory := informers.NewSharedInformerFactory(client, 0)
	fmt.Println(factory.Samplecrd().V1().Networks().Lister() != nil)
}
EOM
cd "$tmp"
go mod tidy
go build -o /dev/null .
if grep -q 'k8s.io/kubernetes' <(go list -deps .); then
  echo "the consumer links k8s.io/kubernetes" >&2
  exit 1
fi
echo "a consumer module builds against the generated clientset without netop's replace directives"
