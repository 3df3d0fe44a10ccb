package drivesync

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/oauth2"
	"google.golang.org/api/googleapi"

	"github.com/drivesync/drivesync/internal/pacer"
)

// How a DriveRemote calls Drive: retries with backoff, and the errors
// Drive gives, sorted into the engine's.

// call runs one Drive request under the pacer. When the tries run out, the
// error is the last one Drive gave, so that its status and reason reach
// the caller.
func (r *DriveRemote) call(ctx context.Context, fn func() error) error {
	tries, transient := 0, false
	err := r.pacer.Call(ctx, func() error { tries++; return fn() }, func(err error) pacer.Retry {
		retry := classifyDrive(err)
		if transient = retry.Again; transient {
			r.log.Info("drive remote: retrying", "err", err, "after", retry.After)
		}
		return retry
	})
	if err != nil && transient && ctx.Err() == nil {
		err = fmt.Errorf("%w (gave up after %d tries)", err, tries)
	}
	return err
}

// classifyDrive decides which failures are worth another try: rate
// limits, server errors and dropped connections. The Go client does not
// retry drive/v3 calls itself.
func classifyDrive(err error) pacer.Retry {
	if errors.As(err, new(*notRetried)) {
		return pacer.Retry{}
	}
	var ge *googleapi.Error
	if errors.As(err, &ge) {
		after := retryAfter(ge.Header)
		switch {
		case ge.Code == http.StatusTooManyRequests, ge.Code >= 500:
			return pacer.Retry{Again: true, After: after}
		case ge.Code == http.StatusForbidden && hasReason(ge, "userRateLimitExceeded", "rateLimitExceeded"):
			return pacer.Retry{Again: true, After: after}
		}
		return pacer.Retry{}
	}
	var re *oauth2.RetrieveError
	if errors.As(err, &re) {
		return pacer.Retry{Again: re.Response != nil && re.Response.StatusCode >= 500}
	}
	var ne net.Error
	if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.ECONNREFUSED) || (errors.As(err, &ne) && ne.Timeout()) {
		return pacer.Retry{Again: true}
	}
	return pacer.Retry{}
}

func retryAfter(h http.Header) time.Duration {
	v := h.Get("Retry-After")
	if v == "" {
		return 0
	}
	if secs, err := strconv.Atoi(v); err == nil {
		return time.Duration(secs) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil {
		return time.Until(t)
	}
	return 0
}

func hasReason(ge *googleapi.Error, reasons ...string) bool {
	for _, item := range ge.Errors {
		for _, r := range reasons {
			if item.Reason == r {
				return true
			}
		}
	}
	return false
}

// fileRefusals are the reasons of a 403 that concern one file, not the
// account or the app's access to the space.
var fileRefusals = []string{"insufficientFilePermissions", "appNotAuthorizedToFile", "cannotDownloadFile", "downloadQuotaExceeded"}

func isNotFound(err error) bool {
	var ge *googleapi.Error
	return errors.As(err, &ge) && ge.Code == http.StatusNotFound
}

func isQuota(ge *googleapi.Error) bool {
	return hasReason(ge, "storageQuotaExceeded", "quotaExceeded", "teamDriveFileLimitExceeded")
}

// driveErr turns a Drive failure into the errors the engine and the app
// understand. Messages never include tokens: googleapi errors carry none,
// and oauth2 errors are reduced to their error code.
func driveErr(op, name string, err error) error {
	if err == nil {
		return nil
	}
	what := "drive remote: " + op
	if name != "" {
		what += " " + name
	}
	var ge *googleapi.Error
	var re *oauth2.RetrieveError
	var ne *net.OpError
	var dns *net.DNSError
	switch {
	case errors.As(err, &ne) && ne.Op == "dial" || errors.As(err, &dns):
		// Offline, most likely: say so before the transport's details.
		return fmt.Errorf("%s: cannot reach Google Drive; check the network connection: %w", what, err)
	case errors.Is(err, fs.ErrNotExist) || isNotFound(err):
		return fmt.Errorf("%s: %w", what, fs.ErrNotExist)
	case errors.As(err, &re):
		return fmt.Errorf("%s: Google refused the sign-in (%s); sign in again: %w", what, re.ErrorCode, ErrAuth)
	case errors.As(err, &ge) && ge.Code == http.StatusUnauthorized:
		return fmt.Errorf("%s: Google Drive refused the credentials (401); sign in again: %w", what, ErrAuth)
	case errors.As(err, &ge) && ge.Code == http.StatusForbidden && isQuota(ge):
		return fmt.Errorf("%s: %w", what, ErrQuota)
	case errors.As(err, &ge) && ge.Code == http.StatusForbidden && hasReason(ge, "insufficientPermissions", "insufficientFilePermissions", "appNotAuthorizedToFile", "forbidden"):
		return fmt.Errorf("%s: the app may not use this Drive folder (%s); sign in again and allow the access the app asks for: %w", what, ge.Errors[0].Reason, ErrAuth)
	}
	return fmt.Errorf("%s: %w", what, err)
}
