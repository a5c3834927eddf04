package controlplane

import (
	"fmt"
	"os"
	"path/filepath"
	_ "unsafe" // for go:linkname

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	_ "k8s.io/apiserver/pkg/storage/storagebackend/factory" // the variable below
)

// The API server's etcd client logs through a zap logger that its package
// makes at init, writing JSON to stderr, where its warnings at shutdown
// ("retrying of unary invoker failed") would reach the user's terminal. It
// is pointed at DIR/logs/etcd-client.log instead.

//go:linkname etcd3ClientLogger k8s.io/apiserver/pkg/storage/storagebackend/factory.etcd3ClientLogger
var etcd3ClientLogger *zap.Logger

func (cp *ControlPlane) redirectEtcdClientLog() error {
	f, err := os.OpenFile(filepath.Join(cp.DataDir, "logs", "etcd-client.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("opening log file: %w", err)
	}
	cp.logFiles = append(cp.logFiles, f)
	encoder := zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig())
	etcd3ClientLogger = zap.New(zapcore.NewCore(encoder, zapcore.AddSync(f), zapcore.InfoLevel)).Named("etcd-client")
	return nil
}
