// Package s3remote is a drivesync.Remote on an S3-compatible bucket: AWS
// S3, MinIO, Cloudflare R2, Backblaze B2 and others that take conditional
// writes.
//
// Each device writes its own immutable objects; none is ever overwritten.
// Create is a PutObject with If-None-Match: *, so that two devices that
// pick one name cannot both succeed. New checks once that the server
// honours that condition (two racing creates of a scratch key: exactly one
// must win) and refuses a server that does not, unless the app opts out
// knowingly (Options.AllowUnconditionalCreate).
package s3remote

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/aws/smithy-go"
	"github.com/aws/smithy-go/middleware"
	smithyhttp "github.com/aws/smithy-go/transport/http"
	"github.com/google/uuid"

	"github.com/drivesync/drivesync"
	"github.com/drivesync/drivesync/internal/pacer"
)

// Options configures a Remote. The zero value works.
type Options struct {
	// Prefix puts the store under a key prefix ("stores/alice/"), so that
	// one bucket holds many stores. A trailing slash is added if missing.
	Prefix string
	// AllowUnconditionalCreate accepts a server that ignores
	// If-None-Match (New's self-test saw two creates of one key both
	// succeed). drivesync's names are unique per device and millisecond,
	// so two devices rarely pick one name; but if they do, one file
	// replaces the other, and the devices that read the first diverge
	// from those that read the second.
	AllowUnconditionalCreate bool
	// MinSleep, MaxSleep and MaxAttempts pace retries of throttled (503
	// SlowDown, 429) and failed (5xx, connection reset) requests, as the
	// Drive remote's do; zero means 100 ms, 30 s and 8.
	MinSleep, MaxSleep time.Duration
	MaxAttempts        int
	// TempDir holds uploads while they are sent; empty means os.TempDir().
	TempDir string
}

// Remote is a drivesync.Remote on one bucket (and prefix).
type Remote struct {
	client *s3.Client
	bucket string
	prefix string
	opts   Options
	pacer  *pacer.Pacer

	mu        sync.Mutex
	offset    time.Duration // the server's time minus the local clock
	haveClock bool
}

var _ drivesync.IdentifiedRemote = (*Remote)(nil)

// New returns a Remote on bucket, which must exist, through client. It
// checks that the bucket is reachable and that the server honours
// conditional creates.
func New(ctx context.Context, client *s3.Client, bucket string, opts Options) (*Remote, error) {
	if client == nil {
		return nil, errors.New("s3remote: New: client is nil")
	}
	if bucket == "" {
		return nil, errors.New("s3remote: New: bucket is empty")
	}
	if opts.Prefix != "" && !strings.HasSuffix(opts.Prefix, "/") {
		opts.Prefix += "/"
	}
	if opts.MinSleep <= 0 {
		opts.MinSleep = 100 * time.Millisecond
	}
	if opts.MaxSleep <= 0 {
		opts.MaxSleep = 30 * time.Second
	}
	if opts.MaxAttempts <= 0 {
		opts.MaxAttempts = 8
	}
	r := &Remote{client: client, bucket: bucket, prefix: opts.Prefix, opts: opts,
		pacer: pacer.New(opts.MinSleep, opts.MaxSleep, opts.MaxAttempts)}
	if _, err := r.Now(ctx); err != nil {
		return nil, err
	}
	if err := r.checkConditionalCreate(ctx); err != nil {
		return nil, err
	}
	return r, nil
}

// checkConditionalCreate races two creates of one scratch key: exactly
// one must win.
func (r *Remote) checkConditionalCreate(ctx context.Context) error {
	key := ".drivesync-probe-" + uuid.NewString()
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for i := range errs {
		wg.Go(func() { errs[i] = r.put(ctx, key, bytes.NewReader([]byte{byte(i)}), 1) })
	}
	wg.Wait()
	defer r.client.DeleteObject(context.WithoutCancel(ctx), &s3.DeleteObjectInput{Bucket: &r.bucket, Key: aws.String(r.prefix + key)})
	won := 0
	for _, err := range errs {
		switch {
		case err == nil:
			won++
		case !errors.Is(err, fs.ErrExist):
			return fmt.Errorf("s3remote: New: checking conditional create on bucket %s: %w", r.bucket, err)
		}
	}
	if won == 1 || r.opts.AllowUnconditionalCreate {
		return nil
	}
	return fmt.Errorf("s3remote: New: bucket %s: the server let %d racing creates of one key succeed: it does not honour If-None-Match: *, so two devices could replace each other's files; use a server with conditional writes (AWS S3, MinIO, R2), or set Options.AllowUnconditionalCreate knowing the risk", r.bucket, won)
}

// Identity names the endpoint, bucket and prefix.
func (r *Remote) Identity(ctx context.Context) (string, error) {
	if err := ctx.Err(); err != nil {
		return "", err
	}
	endpoint := aws.ToString(r.client.Options().BaseEndpoint)
	if endpoint == "" {
		endpoint = "aws:" + r.client.Options().Region
	}
	return "s3:" + endpoint + "/" + r.bucket + "/" + r.prefix, nil
}

// List returns the store's objects last modified at or after since (to
// the second the server keeps), and every object for a zero since.
func (r *Remote) List(ctx context.Context, since time.Time) ([]drivesync.RemoteFile, error) {
	in := &s3.ListObjectsV2Input{Bucket: &r.bucket, Prefix: aws.String(r.prefix)}
	cutoff := since.Truncate(time.Second).Add(-time.Second)
	var out []drivesync.RemoteFile
	for {
		var page *s3.ListObjectsV2Output
		err := r.call(ctx, func() (err error) {
			page, err = r.client.ListObjectsV2(ctx, in, r.noteDate)
			return err
		})
		if err != nil {
			return nil, r.fail("list", "", err)
		}
		for _, o := range page.Contents {
			name := strings.TrimPrefix(aws.ToString(o.Key), r.prefix)
			if strings.HasPrefix(name, ".") || strings.Contains(name, "/.") {
				continue // the self-test's scratch keys, and temp files of other tools
			}
			if !since.IsZero() && o.LastModified != nil && o.LastModified.Before(cutoff) {
				continue
			}
			out = append(out, drivesync.RemoteFile{Name: name, Size: aws.ToInt64(o.Size)})
		}
		if !aws.ToBool(page.IsTruncated) {
			return out, nil
		}
		in.ContinuationToken = page.NextContinuationToken
	}
}

// Open reads an object.
func (r *Remote) Open(ctx context.Context, name string) (io.ReadCloser, error) {
	if err := drivesync.CheckRemoteName(name); err != nil {
		return nil, fmt.Errorf("s3remote: open: %w", err)
	}
	var out *s3.GetObjectOutput
	err := r.call(ctx, func() (err error) {
		out, err = r.client.GetObject(ctx, &s3.GetObjectInput{Bucket: &r.bucket, Key: aws.String(r.prefix + name)}, r.noteDate)
		return err
	})
	if err != nil {
		return nil, r.fail("open", name, err)
	}
	return out.Body, nil
}

// Create stores content under name unless an object has it. Content is
// spooled to a temp file first (unless it is one already): a request is
// signed over its body and may be sent again, and a snapshot may be far
// larger than memory should hold.
func (r *Remote) Create(ctx context.Context, name string, content io.Reader) error {
	if err := drivesync.CheckRemoteName(name); err != nil {
		return fmt.Errorf("s3remote: create: %w", err)
	}
	f, size, done, err := r.spool(content)
	if err != nil {
		return fmt.Errorf("s3remote: create %s: %w", name, err)
	}
	defer done()
	if err := r.put(ctx, name, f, size); err != nil {
		return r.fail("create", name, err)
	}
	return nil
}

// spool returns content as a file to read from its start, its size, and
// what to call once done with it.
func (r *Remote) spool(content io.Reader) (io.ReadSeeker, int64, func(), error) {
	if rs, ok := content.(io.ReadSeeker); ok {
		if pos, err := rs.Seek(0, io.SeekCurrent); err == nil {
			if end, err := rs.Seek(0, io.SeekEnd); err == nil {
				return io.NewSectionReader(readerAt{rs}, pos, end-pos), end - pos, func() {}, nil
			}
		}
	}
	f, err := os.CreateTemp(r.opts.TempDir, "drivesync-s3-*")
	if err != nil {
		return nil, 0, nil, err
	}
	done := func() {
		f.Close()
		os.Remove(f.Name())
	}
	size, err := io.Copy(f, content)
	if err != nil {
		done()
		return nil, 0, nil, fmt.Errorf("read content: %w", err)
	}
	return f, size, done, nil
}

// readerAt reads a ReadSeeker at offsets, for a SectionReader (one reader
// at a time: the requests of one Create are sent one after another).
type readerAt struct{ rs io.ReadSeeker }

func (r readerAt) ReadAt(p []byte, off int64) (int, error) {
	if _, err := r.rs.Seek(off, io.SeekStart); err != nil {
		return 0, err
	}
	return io.ReadFull(r.rs, p)
}

// put creates key (under the prefix) from body with If-None-Match: *,
// retrying a conflict of two racing conditional creates (409
// ConditionalRequestConflict) as AWS asks.
func (r *Remote) put(ctx context.Context, key string, body io.ReadSeeker, size int64) error {
	return r.call(ctx, func() error {
		if _, err := body.Seek(0, io.SeekStart); err != nil {
			return err
		}
		_, err := r.client.PutObject(ctx, &s3.PutObjectInput{
			Bucket:        &r.bucket,
			Key:           aws.String(r.prefix + key),
			Body:          body,
			ContentLength: aws.Int64(size),
			IfNoneMatch:   aws.String("*"),
		}, r.noteDate)
		if status(err) == http.StatusPreconditionFailed {
			return fmt.Errorf("%w: %w", fs.ErrExist, err)
		}
		return err
	})
}

// Delete removes an object; a missing one is not an error.
func (r *Remote) Delete(ctx context.Context, name string) error {
	if err := drivesync.CheckRemoteName(name); err != nil {
		return fmt.Errorf("s3remote: delete: %w", err)
	}
	err := r.call(ctx, func() error {
		_, err := r.client.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: &r.bucket, Key: aws.String(r.prefix + name)}, r.noteDate)
		if status(err) == http.StatusNotFound {
			return nil
		}
		return err
	})
	if err != nil {
		return r.fail("delete", name, err)
	}
	return nil
}

// Now returns the server's time, estimated from the Date headers of its
// responses (a HeadBucket if there was none yet).
func (r *Remote) Now(ctx context.Context) (time.Time, error) {
	if err := ctx.Err(); err != nil {
		return time.Time{}, err
	}
	r.mu.Lock()
	have := r.haveClock
	r.mu.Unlock()
	if !have {
		err := r.call(ctx, func() error {
			_, err := r.client.HeadBucket(ctx, &s3.HeadBucketInput{Bucket: &r.bucket}, r.noteDate)
			return err
		})
		if err != nil {
			return time.Time{}, r.fail("read clock", "", err)
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.haveClock {
		return time.Time{}, errors.New("s3remote: the server's responses have no Date header")
	}
	return time.Now().Add(r.offset).UTC(), nil
}

// noteDate is an API option that narrows the clock estimate from each
// response's Date header: the server's time on arrival was within
// [D, D+1s).
func (r *Remote) noteDate(o *s3.Options) {
	o.APIOptions = append(o.APIOptions, func(stack *middleware.Stack) error {
		return stack.Deserialize.Add(middleware.DeserializeMiddlewareFunc("drivesyncDate",
			func(ctx context.Context, in middleware.DeserializeInput, next middleware.DeserializeHandler) (middleware.DeserializeOutput, middleware.Metadata, error) {
				out, md, err := next.HandleDeserialize(ctx, in)
				if resp, ok := out.RawResponse.(*smithyhttp.Response); ok {
					r.noteHeader(resp.Header)
				}
				return out, md, err
			}), middleware.After)
	})
}

func (r *Remote) noteHeader(h http.Header) {
	d, err := http.ParseTime(h.Get("Date"))
	if err != nil {
		return
	}
	now := time.Now()
	low, high := d.Sub(now), d.Add(time.Second).Sub(now)
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case !r.haveClock:
		r.offset, r.haveClock = low, true
	case r.offset < low:
		r.offset = low
	case r.offset >= high:
		r.offset = high - time.Millisecond
	}
}

// call runs fn, retrying what is transient.
func (r *Remote) call(ctx context.Context, fn func() error) error {
	return r.pacer.Call(ctx, fn, classify)
}

// classify says which failures are worth another try: throttling, server
// errors, a conditional-create conflict, a connection cut.
func classify(err error) pacer.Retry {
	if errors.Is(err, fs.ErrExist) {
		return pacer.Retry{}
	}
	var ae smithy.APIError
	if errors.As(err, &ae) {
		switch ae.ErrorCode() {
		case "SlowDown", "ConditionalRequestConflict", "RequestTimeout", "InternalError", "ServiceUnavailable", "OperationAborted":
			return pacer.Retry{Again: true}
		}
	}
	switch s := status(err); {
	case s == http.StatusTooManyRequests || s == http.StatusConflict || s >= 500:
		return pacer.Retry{Again: true}
	case s != 0:
		return pacer.Retry{}
	}
	var nf *types.NoSuchKey
	if errors.As(err, &nf) {
		return pacer.Retry{}
	}
	// No response at all: a connection refused, reset or cut.
	return pacer.Retry{Again: true}
}

// status is the HTTP status of a failed request, or 0.
func status(err error) int {
	var re *smithyhttp.ResponseError
	if errors.As(err, &re) {
		return re.HTTPStatusCode()
	}
	return 0
}

// fail turns a failed request into the error drivesync expects: a missing
// object matches fs.ErrNotExist, an object this account may not read
// fs.ErrPermission, bad credentials drivesync.ErrAuth; the rest is the
// remote failing.
func (r *Remote) fail(op, name string, err error) error {
	what := "s3remote: " + op
	if name != "" {
		what += " " + name
	}
	var nk *types.NoSuchKey
	var ae smithy.APIError
	switch {
	case errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("%s: %w", what, err)
	case errors.Is(err, fs.ErrExist):
		return fmt.Errorf("%s: %w", what, err)
	case errors.As(err, &nk) || status(err) == http.StatusNotFound && op == "open":
		return fmt.Errorf("%s: %w", what, fs.ErrNotExist)
	case errors.As(err, &ae) && (ae.ErrorCode() == "InvalidAccessKeyId" || ae.ErrorCode() == "SignatureDoesNotMatch" || ae.ErrorCode() == "ExpiredToken"):
		return fmt.Errorf("%s: %w: check the access key and secret (%v)", what, drivesync.ErrAuth, err)
	case errors.As(err, &ae) && ae.ErrorCode() == "NoSuchBucket":
		return fmt.Errorf("%s: bucket %s does not exist: create it, or check its name and region: %w", what, r.bucket, err)
	case status(err) == http.StatusForbidden && op == "open":
		return fmt.Errorf("%s: %w: %v", what, fs.ErrPermission, err)
	case status(err) == http.StatusForbidden:
		return fmt.Errorf("%s: %w: the access key may not use bucket %s (give it s3:ListBucket, s3:GetObject, s3:PutObject and s3:DeleteObject) (%v)", what, drivesync.ErrAuth, r.bucket, err)
	}
	return fmt.Errorf("%s: %w", what, err)
}
