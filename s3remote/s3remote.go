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
	"crypto/md5"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/url"
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
	"github.com/drivesync/drivesync/internal/remoteclock"
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
	// PartSize: a file larger than this (a big snapshot) is uploaded in
	// parts of this size, a request each; zero means 64 MiB, and S3
	// takes no part under 5 MiB.
	PartSize int64
}

// The sizes S3 takes: a part of a multipart upload is at least 5 MiB
// (but the last), and an upload has at most 10,000 parts.
const (
	minPartSize = 5 << 20
	maxPartSize = 5 << 30
	maxParts    = 10000
)

// staleUpload is how old an unfinished multipart upload of the store must
// be before the next upload in parts aborts it (see sweepUploads).
const staleUpload = 24 * time.Hour

// Remote is a drivesync.Remote on one bucket (and prefix).
type Remote struct {
	client *s3.Client
	bucket string
	prefix string
	opts   Options
	pacer  *pacer.Pacer
	date   remoteclock.Clock // the server's time, from its Date headers
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
	if opts.PartSize <= 0 {
		opts.PartSize = 64 << 20
	}
	opts.PartSize = min(max(opts.PartSize, minPartSize), maxPartSize)
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
		wg.Go(func() { errs[i] = r.put(ctx, key, io.NewSectionReader(bytes.NewReader([]byte{byte(i)}), 0, 1)) })
	}
	wg.Wait()
	// Under ctx: a scratch key left behind (ctx ended) is harmless, as
	// listings skip it.
	defer r.client.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: &r.bucket, Key: aws.String(r.prefix + key)}, r.each)
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

// List returns every object of the store, whatever since is, as
// FolderRemote does: one request per thousand objects. Filtering by
// LastModified would save no request, and would trust a time that is not
// when an object became visible: AWS gives an object uploaded in parts
// the time its upload began, so a snapshot whose upload outlasts the
// engine's ListOverlap would never be listed to a device that synced
// meanwhile. Nor does List skip keys by name (StartAfter): a Remote lists
// what exists, whatever the names say.
//
// Keys are asked for URL-encoded: a key with a control character (put
// there by another tool) would otherwise make the response unreadable,
// and every listing fail.
func (r *Remote) List(ctx context.Context, since time.Time) ([]drivesync.RemoteFile, error) {
	in := &s3.ListObjectsV2Input{Bucket: &r.bucket, Prefix: aws.String(r.prefix), EncodingType: types.EncodingTypeUrl}
	var out []drivesync.RemoteFile
	for {
		var page *s3.ListObjectsV2Output
		err := r.call(ctx, func() (err error) {
			page, err = r.client.ListObjectsV2(ctx, in, r.each)
			return err
		})
		if err != nil {
			return nil, r.fail("list", "", err)
		}
		for _, o := range page.Contents {
			key, err := url.QueryUnescape(aws.ToString(o.Key))
			if err != nil {
				continue // not what the server's encoding makes: no key of ours
			}
			name := strings.TrimPrefix(key, r.prefix)
			if strings.HasPrefix(name, ".") || strings.Contains(name, "/.") {
				continue // the self-test's scratch keys, and temp files of other tools
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
		out, err = r.client.GetObject(ctx, &s3.GetObjectInput{Bucket: &r.bucket, Key: aws.String(r.prefix + name)}, r.each)
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
// larger than memory should hold. A file larger than Options.PartSize
// goes in parts, and only the upload's completion is conditional.
func (r *Remote) Create(ctx context.Context, name string, content io.Reader) error {
	if err := drivesync.CheckRemoteName(name); err != nil {
		return fmt.Errorf("s3remote: create: %w", err)
	}
	body, done, err := r.spool(content)
	if err != nil {
		return fmt.Errorf("s3remote: create %s: %w", name, err)
	}
	defer done()
	if body.Size() > r.opts.PartSize {
		err = r.putParts(ctx, name, body)
	} else {
		err = r.put(ctx, name, body)
	}
	if err != nil {
		return r.fail("create", name, err)
	}
	return nil
}

// spool returns content as a reader of its bytes from its start, and what
// to call once done with it.
func (r *Remote) spool(content io.Reader) (*io.SectionReader, func(), error) {
	if rs, ok := content.(io.ReadSeeker); ok {
		if pos, err := rs.Seek(0, io.SeekCurrent); err == nil {
			if end, err := rs.Seek(0, io.SeekEnd); err == nil {
				return io.NewSectionReader(readerAt{rs}, pos, end-pos), func() {}, nil
			}
		}
	}
	f, err := os.CreateTemp(r.opts.TempDir, "drivesync-s3-*")
	if err != nil {
		return nil, nil, err
	}
	done := func() {
		f.Close()
		os.Remove(f.Name())
	}
	size, err := io.Copy(f, content)
	if err != nil {
		done()
		return nil, nil, fmt.Errorf("read content: %w", err)
	}
	return io.NewSectionReader(f, 0, size), done, nil
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
//
// A retried request may meet its own earlier attempt: one whose response
// was lost (a connection cut, a gateway's 5xx) after the server stored
// the object. Then the server answers 412, and the object is taken as
// ours when its ETag is our content's MD5 (as it is for a plain PUT).
// Otherwise Create reports fs.ErrExist, and the engine uploads the file
// again under another name, which is harmless.
func (r *Remote) put(ctx context.Context, key string, body *io.SectionReader) error {
	tried := false
	return r.call(ctx, func() error {
		if _, err := body.Seek(0, io.SeekStart); err != nil {
			return err
		}
		_, err := r.client.PutObject(ctx, &s3.PutObjectInput{
			Bucket:        &r.bucket,
			Key:           aws.String(r.prefix + key),
			Body:          body,
			ContentLength: aws.Int64(body.Size()),
			IfNoneMatch:   aws.String("*"),
		}, r.each)
		if status(err) == http.StatusPreconditionFailed {
			if tried {
				if sum, serr := md5Of(body); serr == nil && r.hasETag(ctx, key, hex.EncodeToString(sum)) {
					return nil
				}
			}
			return fmt.Errorf("%w: %w", fs.ErrExist, err)
		}
		tried = true
		return err
	})
}

// putParts creates key from body in a multipart upload, completed with
// If-None-Match: * (AWS and MinIO check the condition there), and aborted
// unless it completed. A completion whose response was lost is retried;
// the server then answers 412 or NoSuchUpload, and the object is ours
// when its ETag is the one S3 gives a multipart upload: the MD5 of the
// parts' MD5s, and their count.
func (r *Remote) putParts(ctx context.Context, key string, body *io.SectionReader) error {
	k := aws.String(r.prefix + key)
	partSize := max(r.opts.PartSize, (body.Size()+maxParts-1)/maxParts)
	r.sweepUploads(ctx)
	var up *s3.CreateMultipartUploadOutput
	err := r.call(ctx, func() (err error) {
		up, err = r.client.CreateMultipartUpload(ctx, &s3.CreateMultipartUploadInput{Bucket: &r.bucket, Key: k}, r.each)
		return err
	})
	if err != nil {
		return err
	}
	completed := false
	defer func() {
		if completed {
			return
		}
		// The parts cost storage until aborted. When ctx has ended (the
		// usual way an upload fails), a short grace of its own; if even
		// that fails, the next upload in parts aborts it a day later.
		actx := ctx
		if ctx.Err() != nil {
			var cancel context.CancelFunc
			actx, cancel = context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
			defer cancel()
		}
		r.client.AbortMultipartUpload(actx, &s3.AbortMultipartUploadInput{Bucket: &r.bucket, Key: k, UploadId: up.UploadId}, r.each)
	}()
	var parts []types.CompletedPart
	sums := md5.New()
	for n, off := int32(1), int64(0); off < body.Size(); n, off = n+1, off+partSize {
		part := io.NewSectionReader(body, off, min(partSize, body.Size()-off))
		sum, err := md5Of(part)
		if err != nil {
			return err
		}
		sums.Write(sum)
		var out *s3.UploadPartOutput
		err = r.call(ctx, func() (err error) {
			if _, err := part.Seek(0, io.SeekStart); err != nil {
				return err
			}
			out, err = r.client.UploadPart(ctx, &s3.UploadPartInput{
				Bucket: &r.bucket, Key: k, UploadId: up.UploadId, PartNumber: aws.Int32(n),
				Body: part, ContentLength: aws.Int64(part.Size()),
			}, r.each)
			return err
		})
		if err != nil {
			return err
		}
		parts = append(parts, types.CompletedPart{ETag: out.ETag, PartNumber: aws.Int32(n)})
	}
	etag := fmt.Sprintf("%x-%d", sums.Sum(nil), len(parts))
	tried := false
	err = r.call(ctx, func() error {
		_, err := r.client.CompleteMultipartUpload(ctx, &s3.CompleteMultipartUploadInput{
			Bucket: &r.bucket, Key: k, UploadId: up.UploadId,
			MultipartUpload: &types.CompletedMultipartUpload{Parts: parts},
			IfNoneMatch:     aws.String("*"),
		}, r.each)
		var nu *types.NoSuchUpload
		taken := status(err) == http.StatusPreconditionFailed
		if tried && (taken || errors.As(err, &nu)) && r.hasETag(ctx, key, etag) {
			return nil
		}
		if taken {
			return fmt.Errorf("%w: %w", fs.ErrExist, err)
		}
		tried = err != nil
		return err
	})
	completed = err == nil
	return err
}

// sweepUploads aborts the store's multipart uploads that began more than a
// day ago: left by a device that failed to abort its own (it lost the
// network, or the app ended). An upload still under way is younger; were
// it not, its completion fails and the engine uploads the file again.
// Best effort: a failure here is not the upload's.
func (r *Remote) sweepUploads(ctx context.Context) {
	now, err := r.Now(ctx)
	if err != nil {
		return
	}
	in := &s3.ListMultipartUploadsInput{Bucket: &r.bucket, Prefix: aws.String(r.prefix)}
	for {
		out, err := r.client.ListMultipartUploads(ctx, in, r.each)
		if err != nil {
			return
		}
		for _, u := range out.Uploads {
			if u.Initiated != nil && now.Sub(*u.Initiated) > staleUpload {
				r.client.AbortMultipartUpload(ctx, &s3.AbortMultipartUploadInput{Bucket: &r.bucket, Key: u.Key, UploadId: u.UploadId}, r.each)
			}
		}
		if !aws.ToBool(out.IsTruncated) {
			return
		}
		in.KeyMarker, in.UploadIdMarker = out.NextKeyMarker, out.NextUploadIdMarker
	}
}

// md5Of returns the MD5 of a section's bytes.
func md5Of(s *io.SectionReader) ([]byte, error) {
	h := md5.New()
	if _, err := io.Copy(h, io.NewSectionReader(s, 0, s.Size())); err != nil {
		return nil, err
	}
	return h.Sum(nil), nil
}

// hasETag says whether the object at key has the given ETag.
func (r *Remote) hasETag(ctx context.Context, key, etag string) bool {
	head, err := r.client.HeadObject(ctx, &s3.HeadObjectInput{Bucket: &r.bucket, Key: aws.String(r.prefix + key)}, r.each)
	return err == nil && strings.Trim(aws.ToString(head.ETag), `"`) == etag
}

// Delete removes an object; a missing one is not an error.
func (r *Remote) Delete(ctx context.Context, name string) error {
	if err := drivesync.CheckRemoteName(name); err != nil {
		return fmt.Errorf("s3remote: delete: %w", err)
	}
	err := r.call(ctx, func() error {
		_, err := r.client.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: &r.bucket, Key: aws.String(r.prefix + name)}, r.each)
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
	if now, have := r.date.Now(); have {
		return now, nil
	}
	err := r.call(ctx, func() error {
		_, err := r.client.HeadBucket(ctx, &s3.HeadBucketInput{Bucket: &r.bucket}, r.each)
		return err
	})
	if err != nil {
		return time.Time{}, r.fail("read clock", "", err)
	}
	now, have := r.date.Now()
	if !have {
		return time.Time{}, errors.New("s3remote: the server's responses have no Date header")
	}
	return now, nil
}

// each is the options of every request: no retries of the SDK's own (the
// pacer is the one place for them, and Create must know when a request
// was sent again), and a middleware that narrows the clock estimate from
// each response's Date header: the server's time on arrival was within
// [D, D+1s).
func (r *Remote) each(o *s3.Options) {
	o.Retryer = aws.NopRetryer{}
	o.APIOptions = append(o.APIOptions, func(stack *middleware.Stack) error {
		return stack.Deserialize.Add(middleware.DeserializeMiddlewareFunc("drivesyncDate",
			func(ctx context.Context, in middleware.DeserializeInput, next middleware.DeserializeHandler) (middleware.DeserializeOutput, middleware.Metadata, error) {
				out, md, err := next.HandleDeserialize(ctx, in)
				if resp, ok := out.RawResponse.(*smithyhttp.Response); ok {
					r.date.Note(resp.Header)
				}
				return out, md, err
			}), middleware.After)
	})
}

// call runs fn, retrying what is transient.
func (r *Remote) call(ctx context.Context, fn func() error) error {
	return r.pacer.Call(ctx, fn, classify)
}

// classify says which failures are worth another try: throttling, server
// errors, a conditional-create conflict, a connection cut.
func classify(err error) pacer.Retry {
	if errors.Is(err, fs.ErrExist) || isFull(err) {
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
	case s == http.StatusNotImplemented:
		return pacer.Retry{}
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

// isFull says whether the server refused a write for want of space: the
// disks are full (507), or the bucket is over a quota set on it.
func isFull(err error) bool {
	var ae smithy.APIError
	if errors.As(err, &ae) {
		switch ae.ErrorCode() {
		case "XMinioStorageFull", "XMinioAdminBucketQuotaExceeded", "QuotaExceeded", "StorageQuotaExceeded":
			return true
		}
	}
	return status(err) == http.StatusInsufficientStorage
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
// object matches fs.ErrNotExist, an object the server will not give this
// key fs.ErrPermission, bad credentials drivesync.ErrAuth, a full server
// drivesync.ErrQuota; the rest is the remote failing.
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
	case isFull(err):
		return fmt.Errorf("%s: %w: the server or the bucket %s is full: delete objects or raise its quota (%v)", what, drivesync.ErrQuota, r.bucket, err)
	case errors.As(err, &ae) && ae.ErrorCode() == "NoSuchBucket" || op == "read clock" && status(err) == http.StatusNotFound:
		return fmt.Errorf("%s: bucket %s does not exist: create it, or check its name and region: %w", what, r.bucket, err)
	case errors.As(err, &ae) && ae.ErrorCode() == "RequestTimeTooSkewed":
		return fmt.Errorf("%s: this device's clock is too far from the server's (S3 refuses requests signed more than 15 minutes off): set the clock right (%w)", what, err)
	case op == "open" && status(err) >= 400 && status(err) < 500:
		// The server refuses this object, not the others: stored with a
		// customer key (SSE-C, 400), archived (403 InvalidObjectState),
		// another account's (403). The engine skips it and tries again
		// later, instead of failing every sync.
		return fmt.Errorf("%s: the server refuses this object to this key: %w: %v", what, fs.ErrPermission, err)
	case status(err) == http.StatusNotImplemented:
		return fmt.Errorf("%s: the server does not implement this request (conditional writes, If-None-Match: *, are needed): use a server that has them (%w)", what, err)
	case status(err) == http.StatusForbidden:
		return fmt.Errorf("%s: %w: the access key may not use bucket %s (give it s3:ListBucket, s3:GetObject, s3:PutObject and s3:DeleteObject) (%v)", what, drivesync.ErrAuth, r.bucket, err)
	}
	return fmt.Errorf("%s: %w", what, err)
}
